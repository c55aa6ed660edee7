"""What both sides keep on disk: private folders and files, the connection file, the keys."""
