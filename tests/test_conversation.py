"""Conversations: the engine's conversation cache (KV rows kept across turns), cancel during
prefill, and the context-full policy (pyspec/text/conversation.py).

Oracle: a fresh engine that prefills the whole conversation. A follow-up turn must give the same
tokens, and its cache rows must be bit-identical to the fresh prefill's, on numpy and on native
WebGPU.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import requires_gpu
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.errors import PromptTooLongError
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.text import conversation


def new_engine(tiny, backend, draft="ngram", max_ctx=None) -> Engine:
    return Engine(backend_for(tiny.on(backend), draft, max_ctx, load_draft=Model.load),
                  tiny.tokenizer)


def rows(engine: Engine, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n committed K and V rows of every layer, (n_layers, n, n_kv, hd) each."""
    kv = engine.kv
    if kv.k is not None:
        return kv.k[:, :n].copy(), kv.v[:, :n].copy()
    return asyncio.run(engine.champion.read_kv(n))


def chat_ids(tiny, messages):
    return tiny.tokenizer.encode_chat(messages)


TURNS = ["the cat sat on the mat. the cat", "the dog ate the bone.", "def f(x): return x"]
OPTS = {"greedy": dict(max_tokens=12, stop_at_eos=False),
        "replay": dict(max_tokens=12, stop_at_eos=False, temperature=0.8, seed=5)}


@pytest.mark.parametrize("mode", list(OPTS))
def test_follow_up_turns_reuse_the_cache_and_equal_a_fresh_prefill(tiny, backend, mode):
    engine = new_engine(tiny, backend)
    messages: list[dict] = []
    for turn, text in enumerate(TURNS):
        messages.append({"role": "user", "content": text})
        prompt = chat_ids(tiny, messages)
        r = engine.generate(prompt, Options(**OPTS[mode]))
        kept = engine.kv.committed
        got_k, got_v = rows(engine, kept)
        fresh = new_engine(tiny, backend)   # on the GPU this shares the cache: it starts anew
        want = fresh.generate(prompt, Options(**OPTS[mode]))
        assert r.tokens == want.tokens, f"turn {turn}"
        assert r.text == want.text
        assert fresh.kv.committed == kept
        want_k, want_v = rows(fresh, kept)
        assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v), f"turn {turn}"
        if turn:
            assert r.stats["reused_tokens"] > 0
            assert r.stats["prefill_tokens"] < len(prompt) - 1
            assert r.stats["reused_tokens"] + r.stats["prefill_tokens"] == len(prompt) - 1
        assert r.stats["prompt_tokens"] == len(prompt)   # what the OpenAI facade reports
        assert want.stats["reused_tokens"] == 0
        messages.append({"role": "assistant", "content": r.text})
        # the fresh engine ran on the same cache (GPU) or its own (numpy): engine picks up again
        engine = fresh


@requires_gpu
def test_a_gpu_draft_model_keeps_its_cache_rows_across_turns(tiny):
    """A draft model with its own cache on the GPU keeps the rows of the turns before, as the
    champion does: the second turn feeds it only what is new, and its rows equal a fresh draft
    prefill of the whole conversation (batch invariance), so the turn's text is unchanged."""
    engine = new_engine(tiny, "gpu", tiny.close_path)
    draft = engine.backend.drafter
    opts = Options(max_tokens=12, k="fixed:3", stop_at_eos=False)
    first = chat_ids(tiny, [{"role": "user", "content": TURNS[0]}])
    r1 = engine.generate(first, opts)
    follow = first + r1.tokens + tiny.tokenizer.encode(TURNS[1])
    starts, prefill = [], draft.model.prefill
    draft.model.prefill = lambda tokens, slot, start=0: (starts.append(start),
                                                         prefill(tokens, slot, start))
    r2 = engine.generate(follow, opts)
    assert starts[0] >= len(first) - 1, "the first turn's rows were prefilled again"
    fresh = new_engine(tiny, "gpu", tiny.close_path)
    assert r2.tokens == fresh.generate(follow, opts).tokens
    # A fresh prefill of the whole conversation into a draft cache gives the same rows.
    n = draft.model.kv.committed
    assert n >= len(first) - 1
    kept = asyncio.run(draft.model.read_kv(n))
    other = fresh.backend.drafter
    other.model.prefill(follow + r2.tokens, 1)
    again = asyncio.run(other.model.read_kv(n))
    assert all(np.array_equal(a, b) for a, b in zip(kept, again))


def test_an_edited_message_rolls_back_to_the_first_differing_token(tiny):
    engine = new_engine(tiny, "cpu")
    first = chat_ids(tiny, [{"role": "user", "content": "the cat sat on the mat. the dog"}])
    engine.generate(first, Options(max_tokens=8, stop_at_eos=False))
    edited = chat_ids(tiny, [{"role": "user", "content": "the cat sat on the bone. the dog"}])
    same = next(i for i, (a, b) in enumerate(zip(first, edited)) if a != b)
    assert engine.reusable(edited) == same
    r = engine.generate(edited, Options(max_tokens=8, stop_at_eos=False))
    want = new_engine(tiny, "cpu").generate(edited, Options(max_tokens=8, stop_at_eos=False))
    assert r.tokens == want.tokens and r.stats["reused_tokens"] == same
    # regenerate: the same prompt again reuses every prompt row but the last token's
    again = engine.generate(edited, Options(max_tokens=8, stop_at_eos=False))
    assert again.tokens == want.tokens and again.stats["reused_tokens"] == len(edited) - 1


def test_another_engine_on_the_same_cache_invalidates_it(tiny, backend):
    a = new_engine(tiny, backend)
    prompt = chat_ids(tiny, [{"role": "user", "content": TURNS[0]}])
    a.generate(prompt, Options(max_tokens=6, stop_at_eos=False))
    assert a.reusable(prompt) == len(prompt) - 1
    a.kv.truncate(0)   # what any other request on this cache does first
    assert a.reusable(prompt) == 0
    a.forget()
    assert a.reusable(prompt) == 0


def test_cancel_during_prefill_stops_between_blocks_and_keeps_the_cache_consistent(tiny, backend):
    engine = new_engine(tiny, backend)
    long_text = " ".join(["the cat sat on the mat. the dog ate the bone."] * 11)
    prompt = chat_ids(tiny, [{"role": "user", "content": long_text}])
    asked = []

    def should_stop():
        asked.append(engine.kv.committed)
        return True                   # at the first chance: after the first block

    report: dict = {}

    async def run():
        async for _ in engine.stream(prompt, Options(max_tokens=8, stop_at_eos=False), report,
                                     should_stop):
            raise AssertionError("no text may come out of a cancelled prefill")

    asyncio.run(run())
    assert report["finish_reason"] == "cancelled" and report["tokens"] == []
    assert 0 < engine.kv.committed < len(prompt) - 1      # stopped between blocks
    # the rows committed before the cancel are reused, and the result equals a fresh run
    assert engine.reusable(prompt) == engine.kv.committed
    r = engine.generate(prompt, Options(max_tokens=8, stop_at_eos=False))
    want = new_engine(tiny, backend).generate(prompt, Options(max_tokens=8, stop_at_eos=False))
    assert r.tokens == want.tokens


# --- the context-full policy -------------------------------------------------------------------

def conversation_of(n_turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(n_turns):
        messages += [{"role": "user", "content": f"question {i}: the cat sat on the mat"},
                     {"role": "assistant", "content": f"answer {i}: the dog ate the bone"}]
    return messages + [{"role": "user", "content": "last question: def f(x)"}]


def test_nothing_is_dropped_when_the_conversation_fits(tiny):
    messages = conversation_of(2)
    fitted = conversation.fit(tiny.tokenizer, messages, 8, 4096)
    assert fitted.ids == tiny.tokenizer.encode_chat(messages)
    assert fitted.dropped_messages == 0 and fitted.notice() is None


def test_the_oldest_whole_turns_go_first_never_the_system_or_last_message(tiny):
    messages = conversation_of(6)
    full = len(tiny.tokenizer.encode_chat(messages))
    ctx = full - 10 + 16          # 16 tokens of generation need about one turn to go
    fitted = conversation.fit(tiny.tokenizer, messages, 16, ctx)
    assert fitted.dropped_messages % 2 == 0 and fitted.dropped_messages >= 2
    n_turns = fitted.dropped_messages // 2
    kept = [messages[0]] + messages[1 + 2 * n_turns:]
    assert fitted.ids == tiny.tokenizer.encode_chat(kept)
    assert len(fitted.ids) + 16 <= ctx
    assert fitted.dropped_tokens == full - len(fitted.ids)
    assert str(fitted.dropped_messages) in fitted.notice()
    # the fewest turns that make it fit: one turn fewer would not
    fewer = [messages[0]] + messages[1 + 2 * (n_turns - 1):]
    assert len(tiny.tokenizer.encode_chat(fewer)) + 16 > ctx
    assert fitted.receipt() == {"dropped_messages": fitted.dropped_messages,
                                "dropped_tokens": fitted.dropped_tokens}


def test_a_max_tokens_past_the_context_keeps_the_conversation(tiny):
    """Where no count of turns left out makes room for max_tokens, leaving turns out cannot
    honour it: the conversation stays (only what the prompt itself needs goes) and the notice
    says how long the answer can run. Where leaving turns out does make room, it still does."""
    encode = tiny.tokenizer.encode_chat
    messages = conversation_of(3)
    full = len(encode(messages))
    fitted = conversation.fit(tiny.tokenizer, messages, 10_000, full + 20)
    assert fitted.ids == encode(messages) and fitted.dropped_messages == 0
    assert fitted.answer_room == 20 and "20 tokens at most" in fitted.notice()
    # the prompt alone does not fit: the fewest turns that let it go, and no more
    fitted = conversation.fit(tiny.tokenizer, messages, 10_000, full - 3)
    assert 2 <= fitted.dropped_messages < 6 and fitted.answer_room == full - 3 - len(fitted.ids)
    fewer = [messages[0]] + messages[1 + fitted.dropped_messages - 2:]
    assert len(encode(fewer)) >= full - 3
    assert "left out" in fitted.notice() and "at most" in fitted.notice()
    # room for max_tokens that leaving turns out can make: made, as before
    fitted = conversation.fit(tiny.tokenizer, messages, 16, full + 5)
    assert fitted.dropped_messages >= 2 and fitted.answer_room is None
    assert len(fitted.ids) + 16 <= full + 5


def test_error_policy_and_a_last_message_too_long_are_refused(tiny):
    messages = conversation_of(6)
    full = len(tiny.tokenizer.encode_chat(messages))
    with pytest.raises(PromptTooLongError, match="context_overflow"):
        conversation.fit(tiny.tokenizer, messages, 16, full, policy="error")
    only_last = len(tiny.tokenizer.encode_chat([messages[0], messages[-1]]))
    with pytest.raises(PromptTooLongError, match="every older turn"):
        conversation.fit(tiny.tokenizer, messages, 16, only_last)
    with pytest.raises(Exception, match="unknown context_overflow"):
        conversation.fit(tiny.tokenizer, messages, 16, 10_000, policy="truncate")


# --- the CLI chat ------------------------------------------------------------------------------

def run_chat(tiny, monkeypatch, capsys, script: str, *extra: str,
             expect: int = 0) -> tuple[str, str]:
    import io

    from pyspec.apps import cli

    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    code = cli.main(["chat", "--champion", tiny.champion_path, "--max-tokens", "6", *extra])
    out, err = capsys.readouterr()
    assert code == expect, err
    return out, err


def test_cli_chat_streams_replies_and_keeps_the_conversation(tiny, monkeypatch, capsys):
    out, err = run_chat(tiny, monkeypatch, capsys,
                        "the cat sat\n/stats\nthe dog\n/reset\nthe cat sat\n/nope\n/quit\nnever\n",
                        "--draft", "none", "--system", "be brief", expect=2)
    replies = out.splitlines()
    assert len(replies) == 3                     # three user turns; /quit ends before "never"
    assert replies[0] == replies[2]              # after /reset the same message, the same reply
    # what the CLI printed is what the engine gives for the same conversation
    tok, engine = tiny.tokenizer, new_engine(tiny, "cpu", "none")
    system = [{"role": "system", "content": "be brief"}]
    first = engine.generate(tok.encode_chat(system + [{"role": "user", "content": "the cat sat"}]),
                            Options(max_tokens=6))
    assert replies[0] == first.text
    second = engine.generate(tok.encode_chat(
        system + [{"role": "user", "content": "the cat sat"},
                  {"role": "assistant", "content": first.text},
                  {"role": "user", "content": "the dog"}]), Options(max_tokens=6))
    assert replies[1] == second.text
    assert "--- " in err                         # /stats printed the first reply's stats
    assert "(conversation cleared)" in err and "unknown command /nope" in err
    # piped input: the refused line makes the exit status 2 (run_chat checks it)
    assert "1 line of the input got no reply" in err


def test_cli_chat_exit_status_counts_refused_lines(tiny, monkeypatch, capsys):
    """A message that cannot fit the context is refused, the chat goes on, and piped input
    ends with status 2 naming how many lines got no reply; all lines answered ends with 0."""
    long_line = "the cat sat " * 200          # far beyond the 64 positions of --ctx 64
    out, err = run_chat(tiny, monkeypatch, capsys, f"{long_line}\nthe dog\n{long_line}\n",
                        "--draft", "none", "--ctx", "64", "--context-overflow", "error",
                        expect=2)
    assert len(out.splitlines()) == 1          # the one message that fits got its reply
    assert err.count("error:") == 3 and "2 lines of the input got no reply" in err
    run_chat(tiny, monkeypatch, capsys, "the dog\n", "--draft", "none", expect=0)


def test_cli_generate_context_overflow(tiny, tmp_path, capsys):
    import json

    from pyspec.apps import cli

    path = tmp_path / "chat.json"
    path.write_text(json.dumps(conversation_of(3)))
    full = len(tiny.tokenizer.encode_chat(conversation_of(3)))
    assert full + 8 < 256                        # it fits the tiny model's own context
    args = ["generate", "--champion", tiny.champion_path, "--messages-json", str(path),
            "--max-tokens", "8", "--draft", "none", "--json"]
    assert cli.main(args + ["--ctx", str(full - 20)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["receipt"]["context"]["dropped_messages"] >= 2
    assert "note:" in err and "left out" in err
    assert cli.main(args) == 0 and "note:" not in capsys.readouterr().err
    assert cli.main(args + ["--ctx", str(full - 20), "--context-overflow", "error"]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("extra, words", [
    (["--top-p", "5"], "--top-p"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--k", "bogus"], "bogus"),
    (["--logit-bias", "9999=1"], "--logit-bias key"),
    (["--verify", "greedy", "--temperature", "1"], "--verify greedy needs temperature 0"),
], ids=["top-p", "max-tokens", "k", "logit-bias-id", "greedy-hot"])
def test_cli_chat_refuses_bad_options_before_the_first_line(tiny, monkeypatch, capsys, extra,
                                                            words):
    """A bad option ends the chat at once with one error line (exit 2): no banner, no prompt
    and no reply first, on a terminal as on piped input (the input is never read)."""
    import io

    from pyspec.apps import cli

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stdin in (io.StringIO("hi\n"), Terminal("hi\n"), io.StringIO("")):
        monkeypatch.setattr("sys.stdin", stdin)
        code = cli.main(["chat", "--champion", tiny.champion_path, "--max-tokens", "6",
                         "--draft", "none", *extra])
        out, err = capsys.readouterr()
        assert code == 2 and out == "", err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert words in err and stdin.tell() == 0
