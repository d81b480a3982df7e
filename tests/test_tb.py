#!/usr/bin/python3
"""test_tb.py TEST_TB - decodes the event file `test_tb write DIR` produces.
test_tb.py gpt2 COHORT_GPT2 COHORT - the same decoding of what the trainer
writes with --tensorboard, compared with its --metrics file, which
`cohort plot` must then draw with one point per step.

Independent of the writer: TFRecord framing and both masked CRC32Cs are
checked by a decoder written here, and the Event messages are parsed by the
protobuf library from a descriptor of TensorFlow's event.proto/summary.proto
(the fields TensorBoard reads). The decoded (tag, step, value) list must
equal the series the writer was asked to write.
"""
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

from google.protobuf import descriptor_pb2, descriptor_pool

try:
    from google.protobuf.message_factory import GetMessageClass
except ImportError:  # protobuf < 4
    from google.protobuf import message_factory

    def GetMessageClass(desc):
        return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)

failures = 0


quiet = False


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        if not quiet:
            print("FAIL:", what, file=sys.stderr)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="tb_test_event.proto", package="tensorflow",
                                            syntax="proto3")
    value = fd.message_type.add(name="SummaryValue")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL,
                    oneof_index=0)
    value.oneof_decl.add(name="value")
    summary = fd.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.SummaryValue")
    event = fd.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL,
                    oneof_index=0)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary", oneof_index=0)
    event.oneof_decl.add(name="what")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return GetMessageClass(pool.FindMessageTypeByName("tensorflow.Event"))


def records(blob):
    off = 0
    while off < len(blob):
        check(len(blob) - off >= 12, "truncated header at %d" % off)
        (n,) = struct.unpack_from("<Q", blob, off)
        (lcrc,) = struct.unpack_from("<I", blob, off + 8)
        check(lcrc == masked(blob[off:off + 8]), "length CRC at %d" % off)
        data = blob[off + 12:off + 12 + n]
        check(len(data) == n and len(blob) >= off + 16 + n, "truncated record at %d" % off)
        (dcrc,) = struct.unpack_from("<I", blob, off + 12 + n)
        check(dcrc == masked(data), "data CRC at %d" % off)
        yield data
        off += 16 + n


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        p = subprocess.run([sys.argv[1], "write", d], capture_output=True, text=True, timeout=60)
        t1 = time.time()
        check(p.returncode == 0, "writer failed: " + p.stderr)
        files = os.listdir(d)
        check(len(files) == 1, "one event file: %r" % files)
        name = files[0]
        m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)", name)
        check(m is not None, "file name " + name)
        check(m and int(t0) - 1 <= int(m.group(1)) <= t1 + 1, "time in the name")
        check(m and m.group(2) == socket.gethostname(), "host in the name")
        check(p.stdout.strip() == os.path.join(d, name), "reported path")
        with open(os.path.join(d, name), "rb") as f:
            blob = f.read()

    # Corrupting any byte must break a CRC (the decoder is not vacuous).
    bad = bytearray(blob)
    bad[30] ^= 1
    global quiet, failures
    before, quiet = failures, True
    list(records(bytes(bad)))
    detected, failures, quiet = failures > before, before, False
    check(detected, "corruption detected")

    Event = event_class()
    events = []
    for data in records(blob):
        e = Event()
        e.ParseFromString(data)
        # Re-encoding with protobuf gives the same bytes: nothing unknown.
        check(e.SerializeToString() == data, "canonical encoding")
        events.append(e)
    check(len(events) == 1 + 200 + 2, "event count %d" % len(events))
    check(events[0].WhichOneof("what") == "file_version" and
          events[0].file_version == "brain.Event:2", "first event is the file version")
    for e in events:
        check(t0 - 1 <= e.wall_time <= t1 + 1, "wall_time %f" % e.wall_time)
    got = [(v.tag, e.step, v.simple_value) for e in events[1:] for v in e.summary.value]
    want = []
    for step in range(100):
        want.append(("train/loss", step, f32(10.0 / f32(step + 1))))
        want.append(("train/lr", step, f32(f32(0.0003) * step)))
    want += [("perf/tokens_per_s", 10**12, 123456.75), ("ünïcode ☃", 10**12, -1.5),
             ("x", 10**12, f32(3.0e38)), ("negative_step", -5, 0.25)]
    check(len(got) == len(want), "value count %d vs %d" % (len(got), len(want)))
    for g, w in zip(got, want):
        check(g[0] == w[0] and g[1] == w[1] and abs(g[2] - w[2]) <= 1e-6 * abs(w[2]),
              "value %r vs %r" % (g, w))
    check(len(events[-2].summary.value) == 3, "three values in one event")
    print("test_tb.py: %d events, %d values, %d failures" % (len(events), len(got), failures))
    return 1 if failures else 0


def gpt2_main(trainer, cohort):
    import json
    import xml.etree.ElementTree as ET
    steps = 7
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        p = subprocess.run([trainer, "--model", "tiny", "--steps", str(steps), "--threads", "1",
                            "--quiet", "--metrics", metrics, "--tensorboard", d],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, "trainer failed: " + p.stderr)
        files = [f for f in os.listdir(d) if f.startswith("events.out.tfevents.")]
        check(len(files) == 1, "one event file: %r" % files)
        with open(os.path.join(d, files[0]), "rb") as f:
            blob = f.read()
        with open(metrics) as f:
            rows = [json.loads(line) for line in f]
        Event = event_class()
        events = []
        for data in records(blob):
            e = Event()
            e.ParseFromString(data)
            events.append(e)
        check(events and events[0].file_version == "brain.Event:2", "file version first")
        scalars = {}
        for e in events[1:]:
            for v in e.summary.value:
                scalars[(v.tag, e.step)] = v.simple_value
        check(len(rows) == steps, "%d metrics rows" % len(rows))
        # The metrics file prints loss in full and tokens_per_s with 3 decimals.
        for row in rows:
            for tag, key, atol in [("train/loss", "loss", 0.0),
                                   ("perf/tokens_per_s", "tokens_per_s", 0.0005)]:
                got = scalars.get((tag, row["step"]))
                check(got is not None and
                      abs(got - f32(row[key])) <= 1e-6 * abs(row[key]) + atol + 1e-30,
                      "step %d %s: event %r vs metrics %r" % (row["step"], tag, got, row[key]))
        out = os.path.join(d, "m.svg")
        p = subprocess.run([cohort, "plot", "-o", out, metrics], capture_output=True, text=True,
                           timeout=60)
        check(p.returncode == 0, "cohort plot: " + p.stderr)
        root = ET.parse(out).getroot()
        counts = {pl.get("class"): len(pl.get("points").split())
                  for pl in root.iter("{http://www.w3.org/2000/svg}polyline")}
        check(counts == {"loss": steps, "tokens_per_s": steps}, "polylines %r" % counts)
    print("test_tb.py gpt2: %d events, %d failures" % (len(events), failures))
    return 1 if failures else 0


if len(sys.argv) == 4 and sys.argv[1] == "gpt2":
    sys.exit(gpt2_main(sys.argv[2], sys.argv[3]))
sys.exit(main())
