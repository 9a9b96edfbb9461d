"""Shard readers: a Segment in, samples out (tar, Parquet), and the chooser make_reader."""
