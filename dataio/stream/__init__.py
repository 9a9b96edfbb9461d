"""The torch-facing loader: config, start-up, state, worker, collate and ShardLoader (make_loader)."""
