"""Tool calls in the page (issue 58): web/tools-example.html's two-tool loop through the facade on
tiny models under the real Qwen 2.5 and Llama 3.2 templates (webtools/site.py TOOL_MODELS): each
round's calls schema-valid with finish_reason "tool_calls", streamed as OpenAI streams them, the
tool's result continuing the conversation, and every round's calls (ids included) those of
`python -m pyspec generate --json --tools` on the same messages. One page load per model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .pageutil import TIMEOUT_S

pytestmark = pytest.mark.browser

_RUN = """async () => {
  await new Promise((r) => { const t = setInterval(() => {
    if (toolsDemo.decoder || toolsDemo.error) { clearInterval(t); r(); } }, 100); });
  if (toolsDemo.error) return { error: `${toolsDemo.error.code}: ${toolsDemo.error.message}` };
  document.getElementById("go").click();
  await new Promise((r) => { const t = setInterval(() => {
    if (!document.getElementById("go").disabled) { clearInterval(t); r(); } }, 100); });
  const e = toolsDemo.error;
  return { rounds: toolsDemo.rounds, messages: toolsDemo.messages, tools: toolsDemo.tools,
           error: e ? `${e.code}: ${e.message}` : null };
}"""


def cli_round(path, tools, messages, choice, tmp_path) -> dict:
    """`generate --json` of one round: the same messages, tools and tool_choice."""
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    (tmp_path / "messages.json").write_text(json.dumps(messages))
    out = subprocess.run(
        [sys.executable, "-m", "pyspec", "generate", "--champion", path, "--draft", "ngram",
         "--tools", str(tmp_path / "tools.json"), "--tool-choice", choice, "--max-tokens", "160",
         "--messages-json", str(tmp_path / "messages.json"), "--json"],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("model", ["tiny-qwen25-tools", "tiny-llama32-tools"])
def test_the_two_tool_loop_equals_the_command_line(context, site_root, model, tmp_path):
    page = context.page(f"tools-example.html?model={model}&choices=get_weather,add,auto")
    out = page.evaluate(_RUN)
    assert out["error"] is None, out["error"]
    rounds, messages, tools = out["rounds"], out["messages"], out["tools"]
    assert [r["choice"] for r in rounds[:2]] == ["get_weather", "add"], rounds
    for r, name in zip(rounds[:2], ["get_weather", "add"]):
        assert r["finish_reason"] == "tool_calls" and r["tool_calls"], r
        assert {c["function"]["name"] for c in r["tool_calls"]} == {name}
        for call in r["tool_calls"]:
            json.loads(call["function"]["arguments"])   # whole JSON, as streamed
    # Each round's request as the command line runs it: the same calls (their ids too).
    path = str(site_root / "models" / f"{model}.gguf")
    asked = [m for m in messages if m["role"] == "user"][:1]
    for n, r in enumerate(rounds):
        cli = cli_round(path, tools, asked, r["choice"], tmp_path)
        assert cli["tool_calls"] == r["tool_calls"], n
        # (OpenAI has no "context": the facade says "length" for it)
        assert {"context": "length"}.get(cli["finish_reason"], cli["finish_reason"]) \
            == r["finish_reason"], n
        if r["finish_reason"] != "tool_calls":
            assert cli["content"] == r["content"]
            break
        k = messages.index(next(m for m in messages if m.get("tool_calls") == r["tool_calls"]))
        asked = messages[:k + 1 + len(r["tool_calls"])]   # the call and its results
        assert [m["role"] for m in asked[k + 1:]] == ["tool"] * len(r["tool_calls"])


_BOTH = """async ([messages, tools]) => {
  const d = toolsDemo.decoder;
  const request = { messages, tools, tool_choice: "required", max_tokens: 160 };
  const completion = await d.chat.completions.create(request);
  const deltas = [];
  for await (const c of await d.chat.completions.create({ ...request, stream: true })) {
    deltas.push({ delta: c.choices[0].delta, finish_reason: c.choices[0].finish_reason });
  }
  return { completion, deltas };
}"""


def test_calls_stream_as_openai_streams_them(context):
    """Not streaming: message.tool_calls and finish_reason "tool_calls" (content null). Streaming:
    each call's first delta carries its index, id, type and name with arguments "", later ones
    fragments of its arguments alone; gathered, they are the completion's calls."""
    page = context.page("tools-example.html?model=tiny-qwen25-tools")
    page.wait_for_function("() => toolsDemo.decoder || toolsDemo.error")
    messages = [{"role": "user", "content": "the cat sat on the mat?"}]
    out = page.evaluate(_BOTH, [messages, page.evaluate("() => toolsDemo.tools")])
    [choice] = out["completion"]["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None and choice["message"]["tool_calls"]
    calls, seen = [], set()
    for d in out["deltas"]:
        for t in d["delta"].get("tool_calls", []):
            if t["index"] not in seen:
                seen.add(t["index"])
                assert set(t) == {"index", "id", "type", "function"}
                assert t["function"]["arguments"] == "" and t["function"]["name"]
                calls.append({"id": t["id"], "type": "function",
                              "function": {"name": t["function"]["name"], "arguments": ""}})
            else:
                assert set(t) == {"index", "function"} and set(t["function"]) == {"arguments"}
                calls[t["index"]]["function"]["arguments"] += t["function"]["arguments"]
    assert calls == choice["message"]["tool_calls"]
    assert [d["finish_reason"] for d in out["deltas"]][-1] == "tool_calls"
    assert sum(len(d["delta"].get("tool_calls", [])) for d in out["deltas"]) > 2 * len(calls)
