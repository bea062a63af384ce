"""The pages people come for: server-rendered views over the stored conversations."""
