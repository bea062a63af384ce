"""Page views: parse the request, check access (404 for what the user may not see),
call a selector, render. Each module serves one page family."""
