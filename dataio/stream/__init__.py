"""What one plan worker does with its tickets: the job it is given (job.py, a leaf), the stream of
its kind (decoded, by_sample, raw, token_stream), collate, fields and slabs, and the DataLoader
dataset over tickets (worker.py)."""
