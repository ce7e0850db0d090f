"""Reading llama.cpp's own tools' outputs as `scripts/gpu-reference.sh` leaves them."""
import json
import pathlib


def batched_tool(d):
    """llama-batched-bench's decode tok/s (S_TG) by sequences, from the JSON lines in folder d."""
    tools = {}
    for f in pathlib.Path(d).glob("llama-batched-bench-*.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                tools[r["pl"]] = r["speed_tg"]
    return tools
