"""The guards every gRPC door stands behind, once: boundary.py maps errors to statuses (statuses.py),
counts calls and refuses them while the server starts or drains; auth.py checks the bearer token;
request_bytes.py refuses undecodable requests; slow_readers.py bounds a streamed write (handlers.py
is how each interceptor wraps a method, per_method.py keeps each method's wrapped handler once built);
calls.py reads a call's deadline.
"""
