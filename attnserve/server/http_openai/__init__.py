"""The OpenAI-compatible HTTP door: door.py (the routes, auth and error boundary), body.py (a body
read within its bounds), request.py (a completions or chat completions body), answers.py (the JSON and
server-sent events answers), tokenize.py (vLLM's /tokenize and /detokenize bodies and answers), errors.py
(OpenAI's error shape and statuses).
"""
