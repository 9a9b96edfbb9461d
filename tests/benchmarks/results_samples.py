"""Small synthetic results files in the shapes the bench scripts write, for the headline readers' tests."""

TOKENS = """# Token loading

Run 2026-02-03 04:05 UTC: `python -m benchmarks.bench_tokens`.

Machine: AMD EPYC, 2 cores, 24 GiB RAM, Linux. Load average at the start: 9.5, 8.0, 7.0 on 2 cores.

| seq_len | workers | loader | tokens/s, median | runs (M tokens/s) | first batch (s) | load |
|---:|---:|---|---:|---|---:|---:|
| 2048 | 0 | shardify, input_ids only | 300.0 M | 300.0 | 1.0 | 9.5 |
| 2048 | 0 | shardify, ids + positions + doc ids | 100.0 M | 100.0 | 1.0 | 9.5 |
| 2048 | 0 | LitData StreamingDataset + TokensLoader | 150.0 M | 150.0 | 1.0 | 9.5 |
| 2048 | 0 | Megatron-Core GPTDataset (+ position ids) | 10.0 M | 10.0 | 1.0 | 9.5 |
| 2048 | 2 | shardify, input_ids only | 200.0 M | 200.0 | 1.0 | 9.5 |
| 2048 | 2 | LitData StreamingDataset + TokensLoader | 16.0 M | 16.0 | 1.0 | 9.5 |
| 2048 | 2 | Megatron-Core GPTDataset (+ position ids) | 20.0 M | 20.0 | 1.0 | 9.5 |
| 2048 | 0 | np.memmap get_batch (nanoGPT; random windows, not exactly once) | 400.0 M | 400.0 | 1.0 | 9.5 |
"""

CLOUDS = """# GCS and Azure Blob on local emulators

Machine: AMD EPYC, 2 cores, 24 GiB RAM, Linux.

Run 2026-02-04.

| store | threads | gcsfs / adlfs | google-cloud-storage / azure-storage-blob |
|---|---|---|---|
| gcs | 4 | 740 | 349 |

| store | loader | MB/s | first batch (s) |
|---|---|---|---|
| gcs | shardify RAW | 800 | 0.06 |
| gcs | webdataset | 20 | 1.43 |
| azure | shardify RAW | 300 | 0.16 |
| azure | webdataset | 400 | 0.07 |

An earlier run, at load average 11-15 (this one: 1-1.5), gave slower reads.
"""

_REGION_ONE_CORE = """### One core, ~500x375 {kind} JPEGs

| path | images per CPU-s | vs today | passes |
|---|---:|---:|---|
| decode only: simplejpeg, full size | 2,000 |  | 2000 |
| RRC: today (simplejpeg scaled decode + crop) | 1,500 | 1.00x | 1500 |
| RRC: PIL (draft + crop) | {pil} | 0.5x | {pil} |
| RRC: region decode | 1,200 | 1.2x | 1200 |
| RRC: webdataset-style | 500 | 0.4x | 500 |
| centre crop: region decode | 9,000 | 6.00x | 9000 |
| RRC: DALI CPU decoders.image_slice | 400 | 0.3x | 400 |
"""

# bench_region's newest run on top, an older one below it; DECODE: then bench_decode's (another machine, date).
REGION = f"""# Region decode (bench_region.py), 2026-02-06 10:00 UTC

Machine: AMD EPYC, 2 cores, 24 GiB RAM, Linux. Load average 0.5, 1.0, 1.0 at the start.

{_REGION_ONE_CORE.format(kind="baseline", pil="600")}
{_REGION_ONE_CORE.format(kind="progressive", pil="1,000")}
### Loader, DECODE, 2 workers, batch 256

| loader | samples/s (median) | samples per CPU-s (median) | runs | load during runs |
|---:|---:|---:|---|---|
| shardify, region decode | 900 | 800 | 900 | 1.0 |
| shardify, today (region off) | 950 | 700 | 950 | 1.0 |
| webdataset | 300 | 250 | 300 | 1.0 |
| plain | 450 | 400 | 450 | 1.0 |

# Region decode (bench_region.py), 2026-02-05 10:00 UTC

Machine: AMD EPYC, 2 cores. Load average 13.7 at the start.

{_REGION_ONE_CORE.format(kind="baseline", pil="1")}
### Loader, DECODE, 2 workers, batch 256

| loader | samples/s (median) | samples per CPU-s (median) | runs | load during runs |
|---:|---:|---:|---|---|
| shardify, region decode | 1 | 1 | 1 | 1.0 |
| webdataset | 1 | 1 | 1 | 1.0 |

<!-- runs above: bench_region.py; below: bench_decode.py -->

"""

BENCH_DECODE = """# CPU decode (single core)

Machine: Intel(R) Xeon(R) Processor, 2 cores, 24 GiB RAM. Load average at the end of the run: 5.3, 6.7, 4.8.

Run 2026-01-22.

### ~500x375 JPEGs (synthetic)

| path | images/s | vs webdataset-style |
|---|---:|---:|
| decode only: simplejpeg, full size | 672 |  |
| decode+RRC224+flip: ours, simplejpeg | 462 | 1.57x |
| decode+RRC224+flip: ours, PIL | 372 | 1.27x |
| decode+RRC224+flip: webdataset-style (PIL + numpy RRC) | 231 | 1.00x |
"""

S3_START = """# S3 first batch: where the time goes

Run 2026-02-07 15:53-16:08 UTC: `python -m benchmarks.profile_s3_start`.

Machine: AMD EPYC, 2 cores, 24 GiB RAM, Linux.
Load average 8-16 on 2 cores while this ran.

| shards | workers | load | shardify (s) | shardify, s3fs first (s) | webdataset (s) | runs |
|---|---:|---:|---:|---:|---:|---|
| 64 MB | 0 | 14.3 | 2.00 | 4.06 | 3.00 | - |
| 64 MB | 2 | 15.7 | 1.00 | 4.69 | 10.00 | - |
"""

DECODE = REGION + BENCH_DECODE
