"""End-to-end tests of `qwen35 tokenize`: the ids it prints equal the golden
Hugging Face ids (tests/data/tokenizer), for text and for a chat request."""

import json
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("Q35_BIN", str(ROOT / "build" / "qwen35"))
DATA = ROOT / "tests" / "data"
TOY = str(DATA / "tokenizer" / "toy35")


def tokenize(*args, stdin=None):
    proc = subprocess.run([BIN, "tokenize", *args], input=stdin, capture_output=True, timeout=60)
    return proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")


def test_text_ids_match_hf_goldens():
    inputs = [bytes.fromhex(l.strip()) for l in (DATA / "tokenizer" / "inputs.txt").read_text().splitlines()]
    golden = (DATA / "tokenizer" / "ids-toy35.txt").read_text().splitlines()
    for i in range(0, len(inputs), 97):  # a spread of the goldens, invalid UTF-8 included, through stdin
        rc, out, err = tokenize("-m", TOY, "--ids-only", stdin=inputs[i])
        assert rc == 0, err
        assert out.strip() == golden[i].strip(), f"input {i}"


def test_pieces_and_special_tokens():
    rc, out, err = tokenize("-m", TOY, "--text", "<|im_start|>user\nhi<think>")
    assert rc == 0, err
    lines = out.splitlines()
    ids = lines[0].split()
    assert ids[0] == "248045" and ids[-1] == "248068"
    assert '"<|im_start|>"' in lines[1] and lines[-1] == f"{len(ids)} tokens"
    rc, out, _ = tokenize("-m", TOY, "--no-special", "--ids-only", "--text", "<|im_start|>")
    assert "248045" not in out.split()


def test_chat_request(tmp_path):
    case = json.loads((DATA / "chat" / "cases.json").read_text())[1]  # user "Hello", thinking on
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": case["messages"], "chat_template_kwargs": {"enable_thinking": True}}))
    rc, chat_out, err = tokenize("-m", TOY, "--chat", str(req), "--ids-only")
    assert rc == 0, err
    rc, text_out, err = tokenize("-m", TOY, "--ids-only", stdin=case["expected"].encode())
    assert rc == 0, err
    assert chat_out == text_out


def test_errors_name_the_file(tmp_path):
    rc, _, err = tokenize("-m", str(tmp_path), "--text", "x")
    assert rc == 1 and str(tmp_path) in err
    (tmp_path / "tokenizer.json").write_text("{not json")
    rc, _, err = tokenize("-m", str(tmp_path), "--text", "x")
    assert rc == 1 and "tokenizer.json" in err
    rc, _, err = tokenize("-m", TOY, "--chat", str(tmp_path / "missing.json"))
    assert rc == 1 and "missing.json" in err
