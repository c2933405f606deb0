"""A tiny llama-architecture model with random weights, written as GGUF with the `gguf`
package, for the real-engine tests: it loads in llama-server in a fraction of a second and
generates hundreds of tokens per second on one core.

Its text is noise, but it is shaped so that what it writes is well-formed:
- The vocabulary is SentencePiece-style ("llama" tokenizer): the 256 byte tokens (so any
  input tokenizes), "▁" and a few words. One residual dimension is held constant (the token
  embeddings set it, no layer writes to it), so the output matrix's column for it acts as a
  per-token bias: control tokens, the end-of-turn token and bytes that are not printable
  ASCII are never sampled (the engine's text is always valid UTF-8, and an answer runs to
  its `max_tokens` unless a grammar ends it, as llama.cpp's tool-call grammar does).
- A ChatML-style chat template written here, with `<tool_call>{json}</tool_call>` for tool
  calls, so `/v1/chat/completions` works and, with `--jinja`, llama.cpp's template analyser
  derives a tool-call format and constrains a required call with a grammar.

Field names follow the GGUF specification (ggml's docs/gguf.md) and llama.cpp's loader
(src/llama-model.cpp, tensor names of the "llama" architecture).
"""

from __future__ import annotations

from pathlib import Path

SEED = 40
# Big enough that a generation takes measurable time (about 1-2k tokens/s on one core): a
# caller's hang-up must reach the engine before its task would have finished anyway.
N_EMBD = 256
N_HEAD = 4
N_FF = 512
N_LAYER = 4
CONTEXT_LENGTH = 4096
BIAS_DIM = 0          # the residual dimension held constant (the "bias" channel)
BIAS_VALUE = 4.0
OPEN_DIM, CLOSE_DIM = 1, 2   # set only by "<tool_call>" and by the end of "</tool_call>"
MARK = 8.0

# Token types (GGUF tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
EOT = SPECIALS.index("<|im_end|>")
# Tool-call markers as tokens of their own, "<tool_call>" favoured a little: llama.cpp's
# grammar for a required call lets free text come first and needs "<tool_call>\n" to start
# the call, which a random model would never spell out byte by byte. Two more channels
# (OPEN_DIM, CLOSE_DIM) make "\n" follow "<tool_call>" and the end of turn follow the
# closing marker; ">" and "</tool_call>" are never sampled in free text, so the end of turn
# comes only where the grammar closed a call (where they are the only choice left).
TOOL_MARKERS = ["<tool_call>", "</tool_call>"]
TOOL_CALL_BIAS = 1.6
NEVER_FREE = {"</tool_call>", "<0x3E>"}
WORDS = (
    "the", "model", "says", "hello", "world", "token", "stream", "engine", "answer", "tool",
    "call", "weather", "city", "rain", "snow", "sun", "cloud", "wind", "north", "south",
    "east", "west", "small", "large", "fast", "slow", "test", "route", "group", "target",
    "reply", "usage", "cost", "limit", "window", "slot", "queue", "cancel", "restart",
)

CHAT_TEMPLATE = """\
{%- if tools -%}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}Tools you may call:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}To call one, write <tool_call>{"name": name, "arguments": {...}}</tool_call><|im_end|>
{% elif messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- elif message.role == 'assistant' -%}
<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif -%}
{%- if message.tool_calls -%}{%- for call in message.tool_calls -%}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor -%}{%- endif -%}
<|im_end|>
{% elif message.role == 'tool' -%}
<|im_start|>tool
{{ message.content }}<|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""


def vocabulary() -> tuple[list[str], list[int], list[float]]:
    """Tokens, their types and their scores (higher merges first)."""
    tokens = list(SPECIALS)
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [BYTE] * 256
    tokens.append("\u2581")
    types.append(NORMAL)
    tokens += ["\u2581" + word for word in WORDS]
    types += [NORMAL] * len(WORDS)
    tokens += TOOL_MARKERS
    types += [USER_DEFINED] * len(TOOL_MARKERS)
    scores = ([0.0] * len(SPECIALS) + [0.0] * 256 + [-float(i) for i in range(1 + len(WORDS))]
              + [0.0] * len(TOOL_MARKERS))
    return tokens, types, scores


def _sampled(tokens: list[str], types: list[int]) -> list[bool]:
    """Which tokens the model may write: printable ASCII bytes, newline, "▁" and words."""
    allowed = []
    for token, kind in zip(tokens, types, strict=True):
        if kind == BYTE:
            byte = int(token[3:5], 16)
            allowed.append((0x20 <= byte <= 0x7E or byte == 0x0A) and token not in NEVER_FREE)
        else:
            allowed.append(kind in (NORMAL, USER_DEFINED) and token not in NEVER_FREE)
    return allowed


def write_tiny_model(path: Path, seed: int = SEED) -> Path:
    """Write the model to `path` (same seed, same bytes) and return it."""
    import gguf  # test-only dependencies, imported where used
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, types, scores = vocabulary()
    n_vocab = len(tokens)

    def normal(*shape: int, scale: float = 0.5) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("sidecar-tiny-random")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(SPECIALS.index("<s>"))
    writer.add_eos_token_id(EOT)
    writer.add_unk_token_id(SPECIALS.index("<unk>"))
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # Weights scaled by 1/sqrt(fan-in), so the residual stream stays near unit size and the
    # bias channel (BIAS_VALUE over it) keeps its weight through the final norm.
    embd, ff = N_EMBD ** -0.5, N_FF ** -0.5
    embeddings = normal(n_vocab, N_EMBD, scale=1.0)
    embeddings[:, BIAS_DIM] = BIAS_VALUE
    embeddings[:, [OPEN_DIM, CLOSE_DIM]] = 0.0
    embeddings[tokens.index("<tool_call>"), OPEN_DIM] = MARK
    for closing in NEVER_FREE:
        embeddings[tokens.index(closing), CLOSE_DIM] = MARK
    output = normal(n_vocab, N_EMBD, scale=2.5 * embd)
    output[:, [BIAS_DIM, OPEN_DIM, CLOSE_DIM]] = 0.0
    output[:, BIAS_DIM] = [0.0 if ok else -1000.0 for ok in _sampled(tokens, types)]
    output[tokens.index("<tool_call>"), BIAS_DIM] = TOOL_CALL_BIAS
    output[tokens.index("<0x0A>"), OPEN_DIM] = 3.0
    output[EOT, CLOSE_DIM] = 1000.0
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    for layer in range(N_LAYER):
        name = f"blk.{layer}."
        attn_out = normal(N_EMBD, N_EMBD, scale=0.5 * embd)
        ffn_down = normal(N_EMBD, N_FF, scale=0.5 * ff)
        attn_out[[BIAS_DIM, OPEN_DIM, CLOSE_DIM], :] = 0.0   # no layer writes to the channels
        ffn_down[[BIAS_DIM, OPEN_DIM, CLOSE_DIM], :] = 0.0
        writer.add_tensor(name + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(name + "attn_q.weight", normal(N_EMBD, N_EMBD, scale=embd))
        writer.add_tensor(name + "attn_k.weight", normal(N_EMBD, N_EMBD, scale=embd))
        writer.add_tensor(name + "attn_v.weight", normal(N_EMBD, N_EMBD, scale=embd))
        writer.add_tensor(name + "attn_output.weight", attn_out)
        writer.add_tensor(name + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(name + "ffn_gate.weight", normal(N_FF, N_EMBD, scale=embd))
        writer.add_tensor(name + "ffn_up.weight", normal(N_FF, N_EMBD, scale=embd))
        writer.add_tensor(name + "ffn_down.weight", ffn_down)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
