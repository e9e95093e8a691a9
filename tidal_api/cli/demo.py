"""The sample batch `tidal up --demo` submits and follows."""

from __future__ import annotations

import io
import json

import click
import requests

from tidal_api.cli.watch import follow

PROMPTS = [
    "Summarise the tides in one sentence.",
    "Name three uses of spare GPU cycles.",
    "Why does a decode step read all the weights?",
    "Write a haiku about batch jobs.",
]


def sample_jsonl(n: int = 24, model: str = "tiny") -> bytes:
    lines = []
    for i in range(n):
        body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}
        lines.append(
            json.dumps({"custom_id": f"demo-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        )
    return ("\n".join(lines) + "\n").encode()


def run_demo(base_url: str, key: str) -> None:
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {key}"
    upload = http.post(
        f"{base_url}/v1/files",
        data={"purpose": "batch"},
        files={"file": ("demo.jsonl", io.BytesIO(sample_jsonl()), "application/jsonl")},
        timeout=30,
    )
    upload.raise_for_status()
    batch = http.post(
        f"{base_url}/v1/batches",
        timeout=30,
        json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    )
    batch.raise_for_status()
    click.echo(f"demo batch {batch.json()['id']} submitted")
    final = follow(http, base_url, batch.json()["id"])
    if final.get("output_file_id"):
        first = http.get(f"{base_url}/v1/files/{final['output_file_id']}/content", timeout=30).text.splitlines()[0]
        click.echo(f"first output line: {first[:300]}")
