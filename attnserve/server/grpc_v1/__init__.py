"""The attnserve.v1 door: servicer.py (TextGeneration over the engine), request.py (a GenerateRequest as
the session's RequestFields), messages.py (the protocol's
messages from the engine's events), model_info.py (GetModelInfo's answer).
"""
