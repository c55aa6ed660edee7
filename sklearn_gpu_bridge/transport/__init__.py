"""How requests reach a worker: ZeroMQ frames, the shared-memory pool and its fast path, or this process."""
