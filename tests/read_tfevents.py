#!/usr/bin/python3
"""Reads TensorBoard event files without TensorFlow, checking every CRC.

An independent check of src/controller/tensorboard.{h,cc} (TensorBoardWriter):
the TFRecord framing, CRC-32C and protobuf wire decoding here are written
from the format's description, sharing nothing with the C++ writer.

Usage:
  read_tfevents.py FILE_OR_DIR
      Prints one JSON object per event that holds a summary, in file order:
        {"step": N, "wall_time": T, "scalars": {"tag": value, ...}}
      Values are the float32 simple_values, printed in the fewest digits
      that give back the same float32; NaN and infinities (which JSON lacks)
      are printed as the strings "nan", "inf" and "-inf". Summary values
      that are not simple_value (images, histograms, tensors) are left out.
      A DIR means the files directly in it whose names contain "tfevents",
      in name order (as TensorBoard reads a run). One line per file on
      stderr says how many records it held and its file_version.

  read_tfevents.py FILE_OR_DIR --check-against metrics.jsonl
      Prints nothing per event; instead, for every line of metrics.jsonl (a
      JSON object with an integer "step"), requires that for every other
      numeric field NAME some event at that step holds the scalar NAME with
      that value as a float32: |float32(v) - value| <= 1e-6 * max(1, |v|).
      null fields (metrics.jsonl's non-finite values) and non-numeric ones
      are skipped and counted. The fields may be spread over several events
      of one step (and a resumed job may have written a step twice: any
      event of that step with a matching value will do). Prints the counts,
      and the first mismatches on stderr.

Damage: a CRC mismatch (of a record's length or data), a record longer than
the file's end other than the last one, or an Event that is not valid
protobuf is an error: the message names the file and byte offset, and the
exit status is 1. A truncated LAST record (the file ends inside a record's
12-byte header or its data: a writer killed mid-write, which TensorBoard
also stops at) is a warning on stderr and is skipped; --strict makes it an
error too.

Exit status: 0 good; 1 a damaged or unreadable file (or none found);
2 bad usage; 3 --check-against found a mismatch.
"""

import argparse
import json
import math
import os
import struct
import sys

# ---- CRC-32C (Castagnoli), reflected polynomial 0x82F63B78 ----------------

_POLY = 0x82F63B78


def _make_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_POLY if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _self_check():
    # The standard check value of CRC-32C, and its table's first entries.
    assert crc32c(b"123456789") == 0xE3069283, "CRC-32C self-check failed"
    assert _TABLE[1] == 0xF26B8303 and _TABLE[128] == 0x82F63B78


# ---- TFRecord framing ------------------------------------------------------


class Damaged(Exception):
    """The file is damaged (not just cut short at its end)."""


class Truncated(Exception):
    """The file ends inside its last record."""


def read_records(data, path):
    """Yields (offset, payload) for each record of `data`.

    Raises Damaged on a CRC mismatch, Truncated when the file ends inside
    a record (after yielding every whole record before it).
    """
    at = 0
    n = len(data)
    while at < n:
        if n - at < 12:
            raise Truncated("%s: the last record, at byte %d, is cut short "
                            "(%d of its 12 header bytes)" % (path, at, n - at))
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc32c(header) != length_crc:
            raise Damaged("%s: the record at byte %d fails its length CRC "
                          "(stored 0x%08x, computed 0x%08x)"
                          % (path, at, length_crc, masked_crc32c(header)))
        end = at + 12 + length + 4
        if end > n:
            raise Truncated("%s: the last record, at byte %d, is cut short "
                            "(%d of %d bytes)"
                            % (path, at, n - at, 12 + length + 4))
        payload = data[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4:end])
        if masked_crc32c(payload) != data_crc:
            raise Damaged("%s: the record at byte %d (%d bytes of data) fails "
                          "its data CRC (stored 0x%08x, computed 0x%08x)"
                          % (path, at, length, data_crc,
                             masked_crc32c(payload)))
        yield at, payload
        at = end


# ---- Protobuf wire format --------------------------------------------------


def _varint(buf, at):
    value = 0
    shift = 0
    while True:
        if at >= len(buf):
            raise ValueError("varint runs past the end")
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")


def parse_fields(buf):
    """Returns [(field_number, wire_type, value)]: an int for wire types 0,
    1 and 5 (the raw bits), bytes for wire type 2."""
    fields = []
    at = 0
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == 0:
            value, at = _varint(buf, at)
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            if at + size > len(buf):
                raise ValueError("fixed%d field runs past the end" % (size * 8))
            value = int.from_bytes(buf[at:at + size], "little")
            at += size
        elif wire_type == 2:
            size, at = _varint(buf, at)
            if at + size > len(buf):
                raise ValueError("length-delimited field runs past the end")
            value = bytes(buf[at:at + size])
            at += size
        else:
            raise ValueError("unsupported wire type %d" % wire_type)
        fields.append((number, wire_type, value))
    return fields


# tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto
EVENT_WALL_TIME, EVENT_STEP, EVENT_FILE_VERSION, EVENT_SUMMARY = 1, 2, 3, 5
SUMMARY_VALUE = 1
VALUE_TAG, VALUE_SIMPLE_VALUE = 1, 2


def _as_int64(u):
    return u - (1 << 64) if u >= (1 << 63) else u


def _bits_to_float32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def decode_event(payload):
    """The Event as a dict: wall_time, step, and file_version or scalars
    (None when the event has no summary)."""
    event = {"wall_time": 0.0, "step": 0, "file_version": None,
             "scalars": None}
    for number, wire_type, value in parse_fields(payload):
        if number == EVENT_WALL_TIME and wire_type == 1:
            event["wall_time"] = struct.unpack("<d", value.to_bytes(8, "little"))[0]
        elif number == EVENT_STEP and wire_type == 0:
            event["step"] = _as_int64(value)
        elif number == EVENT_FILE_VERSION and wire_type == 2:
            event["file_version"] = value.decode("utf-8", "replace")
        elif number == EVENT_SUMMARY and wire_type == 2:
            scalars = {}
            for vnum, vtype, vbytes in parse_fields(value):
                if vnum != SUMMARY_VALUE or vtype != 2:
                    continue
                tag, simple = None, None
                for fnum, ftype, fval in parse_fields(vbytes):
                    if fnum == VALUE_TAG and ftype == 2:
                        tag = fval.decode("utf-8", "replace")
                    elif fnum == VALUE_SIMPLE_VALUE and ftype == 5:
                        simple = _bits_to_float32(fval)
                if tag is not None and simple is not None:
                    scalars[tag] = simple
            event["scalars"] = scalars
        # Other fields (graph_def, session_log, source_metadata, ...) are
        # valid but not ours to show.
    return event


# ---- Output ----------------------------------------------------------------


def to_float32(v):
    """`v` rounded to float32 (+-inf beyond its range)."""
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def float32_json(f):
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    for digits in range(1, 10):  # 9 significant digits always round-trip
        short = float("%.*g" % (digits, f))
        if to_float32(short) == f:
            return short
    return f


def event_files(target):
    if os.path.isdir(target):
        names = sorted(n for n in os.listdir(target) if "tfevents" in n)
        files = [os.path.join(target, n) for n in names
                 if os.path.isfile(os.path.join(target, n))]
        if not files:
            raise Damaged("%s: no file whose name contains 'tfevents'"
                          % target)
        return files
    if os.path.isfile(target):
        return [target]
    raise Damaged("%s: no such file or directory" % target)


def read_events(target, strict):
    """Yields the decoded events of every file; warnings go to stderr."""
    for path in event_files(target):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise Damaged("%s: cannot read: %s" % (path, e.strerror))
        count = 0
        file_version = None
        try:
            for offset, payload in read_records(data, path):
                try:
                    event = decode_event(payload)
                except (ValueError, struct.error) as e:
                    raise Damaged("%s: the record at byte %d is not a valid "
                                  "Event: %s" % (path, offset, e))
                if count == 0:
                    file_version = event["file_version"]
                count += 1
                yield event
        except Truncated as e:
            if strict:
                raise Damaged(str(e))
            print("read_tfevents: warning: %s; skipped it" % e,
                  file=sys.stderr)
        if count and not (file_version or "").startswith("brain.Event:"):
            print("read_tfevents: warning: %s: the first event has no "
                  "file_version 'brain.Event:N'" % path, file=sys.stderr)
        print("read_tfevents: %s: %d record(s), file_version %s"
              % (path, count, file_version), file=sys.stderr)


def print_events(target, strict):
    for event in read_events(target, strict):
        if event["scalars"] is None:
            continue
        out = {"step": event["step"], "wall_time": event["wall_time"],
               "scalars": {tag: float32_json(v)
                           for tag, v in event["scalars"].items()}}
        print(json.dumps(out))
    return 0


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_against(target, metrics_path, strict):
    by_step = {}  # step -> [scalars dict of each event at that step]
    for event in read_events(target, strict):
        if event["scalars"] is not None:
            by_step.setdefault(event["step"], []).append(event["scalars"])
    try:
        with open(metrics_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise Damaged("%s: cannot read: %s" % (metrics_path, e.strerror))

    checked_lines = matched = skipped = 0
    problems = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = "%s:%d" % (metrics_path, number)
        try:
            record = json.loads(line)
        except ValueError as e:
            problems.append("%s: not JSON: %s" % (where, e))
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if not _is_number(step) or step != int(step):
            problems.append("%s: no integer \"step\"" % where)
            continue
        step = int(step)
        checked_lines += 1
        events = by_step.get(step, [])
        for name, v in record.items():
            if name == "step":
                continue
            if not _is_number(v):
                skipped += 1
                continue
            want = to_float32(v)
            tol = 1e-6 * max(1.0, abs(v))
            got = [s[name] for s in events if name in s]
            if any(g == want or abs(g - want) <= tol for g in got):
                matched += 1
            elif not events:
                problems.append("%s: step %d: no event at this step (field "
                                "%r)" % (where, step, name))
            elif not got:
                problems.append("%s: step %d: no scalar %r in its events"
                                % (where, step, name))
            else:
                problems.append("%s: step %d: %r is %r, events hold %s"
                                % (where, step, name, v,
                                   ", ".join(json.dumps(float32_json(g))
                                             for g in got)))
    metrics_steps = set()
    for line in lines:
        try:
            metrics_steps.add(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            pass
    extra_steps = len(set(by_step) - metrics_steps)
    print("checked %d metrics lines: %d fields matched, %d mismatched, "
          "%d non-numeric or null fields skipped; %d event steps are not in "
          "%s" % (checked_lines, matched, len(problems), skipped, extra_steps,
                  metrics_path))
    for p in problems[:20]:
        print("read_tfevents: mismatch: " + p, file=sys.stderr)
    if len(problems) > 20:
        print("read_tfevents: ... and %d more" % (len(problems) - 20),
              file=sys.stderr)
    return 3 if problems else 0


def main(argv):
    parser = argparse.ArgumentParser(
        description="Read TensorBoard event files (no TensorFlow needed), "
        "checking every CRC.")
    parser.add_argument("target", metavar="FILE_OR_DIR")
    parser.add_argument("--check-against", metavar="METRICS_JSONL",
                        help="require every numeric field of every line to "
                        "be a scalar of an event at that line's step")
    parser.add_argument("--strict", action="store_true",
                        help="a truncated last record is an error, not a "
                        "warning")
    args = parser.parse_args(argv)
    _self_check()
    try:
        if args.check_against:
            return check_against(args.target, args.check_against, args.strict)
        return print_events(args.target, args.strict)
    except Damaged as e:
        print("read_tfevents: error: %s" % e, file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
