"""Ray Serve as the distributed engine: attnserve.v1 through Ray's gRPC proxy, one engine per replica.

config.py: `attnserve ray-serve`'s settings (the replica's share of ServerConfig, and Ray's own);
context.py: the servicer context a replica's RPC sees, over Ray's; deployment.py: the replica, a
Server's model and engine behind the unchanged TextGenerationServicer; main.py: the command that starts Ray, deploys
the application and waits for SIGTERM. Nothing here imports torch; only deployment.py and main.py
import ray.
"""
