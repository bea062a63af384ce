// Send spans with an official OpenTelemetry JS exporter, configured only by the
// standard OTEL_EXPORTER_OTLP_* variables; print the ids of the spans sent (JSON).
//   node export_spans.js json|proto <conversation id> <span count>
'use strict';
const { BasicTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { Resource } = require('@opentelemetry/resources');

const [protocol, conversation, count] = process.argv.slice(2);
const { OTLPTraceExporter } = protocol === 'proto'
  ? require('@opentelemetry/exporter-trace-otlp-proto')
  : require('@opentelemetry/exporter-trace-otlp-http');

const exporter = new OTLPTraceExporter();
const provider = new BasicTracerProvider({ resource: new Resource({ 'service.name': `js-${protocol}` }) });
provider.addSpanProcessor(new BatchSpanProcessor(exporter, { maxExportBatchSize: 100, scheduledDelayMillis: 50 }));
const tracer = provider.getTracer('interop-js', '1.0.0');
const sent = [];
for (let i = 0; i < Number(count); i++) {
  const span = tracer.startSpan(`chat ${protocol} ${i}`, {
    attributes: { 'gen_ai.conversation.id': conversation, 'gen_ai.request.model': 'gpt-4o', 'gen_ai.usage.input_tokens': 10 + i },
  });
  span.end();
  sent.push(span.spanContext().spanId);
}
let failed = 0;
const original = exporter.export.bind(exporter);
exporter.export = (spans, done) => original(spans, (result) => { if (result.code !== 0) { failed += spans.length; console.error(String(result.error)); } done(result); });
provider.shutdown().then(() => {
  process.stdout.write(JSON.stringify({ sent, failed }) + '\n');
  process.exit(failed ? 1 : 0);
});
