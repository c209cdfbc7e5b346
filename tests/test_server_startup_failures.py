"""A start-up that fails leaves nothing running: `attnserve serve --http-port` with a chat template it
cannot take ends at once in one line (it once printed a traceback and then waited on its engine core
forever), a failure nothing foresaw stops the engine core's process and exits 1, and a list of named
chat templates (a format transformers reads) is served by its "default"."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import re
import shutil

import pytest
from fixtures_server import ServeProcess

from attnserve.server import app
from attnserve.server.config import ServerConfig
from attnserve.tokenizer.chat_template import ChatTemplateError, read_chat_template

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def with_tokenizer_config(model_dir, tmp_path, config: dict):
    out = tmp_path / "model"
    shutil.copytree(model_dir, out)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_a_list_of_named_templates_gives_its_default_and_anything_else_is_refused_naming_it(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": TEMPLATE}]
    path.write_text(json.dumps({"chat_template": named, "eos_token": {"content": "</s>"}}))
    template = read_chat_template(tmp_path)
    assert template is not None and template.text == TEMPLATE and template.eos_token == "</s>"
    assert template.render([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
    for value, problem in [
        ([{"name": "tool_use", "template": "tools"}], "no template named 'default' among the list's ('tool_use')"),
        (7, "a string or a list of named templates, not int"),
        ([{"name": "default", "template": 7}], "the template named 'default' is not a string"),
    ]:
        path.write_text(json.dumps({"chat_template": value}))
        with pytest.raises(ChatTemplateError, match=re.escape(problem)):
            read_chat_template(tmp_path)
    path.write_text("[" * 10_000)
    with pytest.raises(ChatTemplateError, match="not a JSON file"):
        read_chat_template(tmp_path)


def test_serve_with_an_http_port_and_a_template_it_cannot_take_exits_2_in_one_line(tiny_model_dir, tmp_path):
    model = with_tokenizer_config(tiny_model_dir, tmp_path, {"chat_template": [{"name": "x", "template": "y"}]})
    serving = ServeProcess("--model", str(model), "--port", "0", "--http-port", "0", "--provider", "cpu")
    try:
        code, out = serving.wait(60)
    finally:
        serving.kill()
    assert serving.port is None and code == 2, out
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert errors == [
        f"attnserve serve: error: {model / 'tokenizer_config.json'}: chat_template: no template named 'default' "
        "among the list's ('x')"
    ], out
    assert "Traceback" not in out


def test_a_failure_nothing_foresaw_stops_the_engine_cores_process_and_exits_1(tiny_model_dir, monkeypatch, capsys):
    def broken(self):
        raise RuntimeError("injected into the HTTP door's start")

    monkeypatch.setattr(app.Server, "_http_server", broken)
    config = ServerConfig(model=str(tiny_model_dir), port=0, http_port=0, provider="cpu", engine_core="process")
    assert asyncio.run(app.serve(config)) == 1
    assert "start-up failed: RuntimeError: injected into the HTTP door's start" in capsys.readouterr().err
    assert multiprocessing.active_children() == []  # the engine core's process was stopped and joined
