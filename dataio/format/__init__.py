"""What a dataset is on disk: the manifest (a version naming its shards) and the tar index."""
