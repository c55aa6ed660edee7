"""Running workers: launching one, the local worker, the background service, WSL, transport selection, doctor."""
