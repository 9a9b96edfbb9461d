"""Sources for `shardify write`: image folders, tables, tar shards, and the chooser open_source."""
