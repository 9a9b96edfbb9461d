"""The write engine of `shardify write` and `shardify append`: the shard plan, local worker processes or
Ray tasks, the shard writers (tar, Parquet, tokens), the journal, resume, the lease and collection."""
