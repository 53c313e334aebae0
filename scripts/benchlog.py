"""The figures of a `drmas bench --json` run from its log: the indented JSON result sits among the
JSON log lines, so the last object holding train_ms_per_step is taken (scripts/device-check.sh)."""
import json


def bench_result(path):
    text, dec, r, i = open(path).read(), json.JSONDecoder(), None, 0
    while (j := text.find("{", i)) >= 0:
        try:
            obj, i = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        if isinstance(obj, dict) and "train_ms_per_step" in obj:
            r = obj
    return r
