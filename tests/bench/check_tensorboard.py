#!/usr/bin/env python3
"""Reads zrun's TensorBoard event file with TensorBoard's own reader and checks it against zrun's CSV
monitor files (run on the GPU machine, where Python and the tensorboard package are available; no
GPU is needed). Exit status 0 when every check passes.

    python3 tests/bench/check_tensorboard.py            # builds nothing; needs ./zrun (ZRUN_BIN to override)
"""
import csv, glob, os, struct, subprocess, sys, tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as e:
    sys.exit(f"check_tensorboard: needs the tensorboard package (pip install tensorboard): {e}")

TAGS = ["Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale",
        "Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
        "Train/Samples/elapsed_time_ms_step"]


def check_crcs(path):
    """Every record's two masked CRC-32Cs, computed by TensorBoard's implementation."""
    data, pos, n = open(path, "rb").read(), 0, 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc_len,) = struct.unpack("<I", data[pos + 8:pos + 12])
        assert crc_len == masked_crc32c(header), f"record {n}: length CRC"
        body = data[pos + 12:pos + 12 + length]
        (crc_body,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert crc_body == masked_crc32c(body), f"record {n}: data CRC"
        pos, n = pos + 16 + length, n + 1
    return n


def main():
    out = tempfile.mkdtemp(prefix="zrun_monitor_")
    zrun = os.environ.get("ZRUN_BIN", "./zrun")
    subprocess.run([zrun, "tests/bench/monitor_run.lua", out], check=True)
    files = glob.glob(os.path.join(out, "tb", "job", "events.out.tfevents.*"))
    assert len(files) == 1, files
    n = check_crcs(files[0])
    acc = EventAccumulator(os.path.join(out, "tb", "job"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert sorted(tags) == sorted(TAGS), tags
    for tag in TAGS:
        events = acc.Scalars(tag)
        name = tag.replace("/", "_")
        with open(os.path.join(out, "csv", "job", name + ".csv"), newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["step", tag.split("/")[-1]], rows[0]
        rows = rows[1:]
        assert len(events) == len(rows) == 10, (tag, len(events), len(rows))
        for e, (step, value) in zip(events, rows):
            assert e.step == int(step), (tag, e.step, step)
            want = struct.unpack("f", struct.pack("f", float(value)))[0]  # simple_value is a float32
            assert e.value == want, (tag, e.step, e.value, value)
        print(f"{tag}: {len(events)} events, steps {events[0].step}..{events[-1].step}, match the CSV")
    print(f"OK: {n} records with valid CRCs in {os.path.basename(files[0])}; TensorBoard reads all {len(TAGS)} tags")


if __name__ == "__main__":
    sys.exit(main())
