"""The HTTP edge: the ASGI app and its routes, request schemas (JSON in, typed requests out, errors
naming the field), response shapes (OpenAI's, field for field), the responders that turn engine
replies into JSON or SSE, the operator's status board, the gateway's worker info, and the listeners
(Unix socket, optional TCP). JSON stops here: nothing below this room sees a dict from a client."""
