"""Guard points: the transparent mount (FUSE) over a backing directory of format-v1
files. Knows the file format and the keyring; nothing of the server."""
