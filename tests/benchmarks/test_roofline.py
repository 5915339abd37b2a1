from transformers import Qwen2Config

from benchmarks.roofline import Limits, Shapes, Work, decode_work

SHAPES = Shapes(hidden=8, layers=2, heads=4, kv_heads=2, intermediate=16, vocab=32)


def test_shapes_read_from_a_model_config():
    config = Qwen2Config(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        vocab_size=1024,
    )
    shapes = Shapes.of(config)
    assert shapes == Shapes(128, 4, 4, 2, 384, 1024)
    assert shapes.kv_width == 64  # 2 heads of 32
    # per layer: q, o 128x128; k, v 128x64; gate, up 128x384; down 384x128; then the head
    per_layer = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 384)
    assert shapes.linear_flops() == 4 * per_layer + 2 * 128 * 1024


def _slow_work(shapes: Shapes, prompts: list[int], samples: list[list[int]]) -> Work:
    """Token by token: every prompt token through the layers, the head on its last only; every
    completion token through layers and head; each attends to all positions up to its own."""
    head = 2 * shapes.hidden * shapes.vocab
    body = shapes.linear_flops() - head
    tokens = linear = flops = read = 0
    for prompt, lengths in zip(prompts, samples, strict=True):
        for t in range(prompt):
            tokens += 1
            linear += body + (head if t == prompt - 1 else 0)
            flops += 4 * shapes.hidden * (t + 1) * shapes.layers
            read += 2 * shapes.kv_width * (t + 1) * shapes.layers * 4
        for n in lengths:
            for t in range(n):
                tokens += 1
                linear += body + head
                flops += 4 * shapes.hidden * (prompt + t + 1) * shapes.layers
                read += 2 * shapes.kv_width * (prompt + t + 1) * shapes.layers * 4
    return Work(tokens, linear, flops, read)


def test_decode_work_matches_a_token_by_token_count():
    prompts, samples = [3, 5, 1], [[2, 0, 4], [1], [6, 6]]
    assert decode_work(SHAPES, prompts, samples) == _slow_work(SHAPES, prompts, samples)


def test_a_worked_example():
    # one prompt of 2 tokens, one completion of 1 token, 1 layer of width 4, 1 head, vocab 2
    shapes = Shapes(hidden=4, layers=1, heads=1, kv_heads=1, intermediate=4, vocab=2)
    work = decode_work(shapes, [2], [[1]])
    per_layer = 2 * (4 * 16 + 3 * 16)  # q, k, v, o and gate, up, down: all 4x4
    head = 2 * 4 * 2
    assert work.tokens == 3
    assert work.linear_flops == 3 * per_layer + 2 * head  # head on the prompt's last, and t=1
    assert work.attention_flops == 4 * 4 * (1 + 2 + 3)  # contexts 1, 2 (prompt), 3 (new token)
    assert work.attention_bytes == 2 * 4 * (1 + 2 + 3) * 4


def test_the_floor_adds_linears_at_their_peak_and_attention_at_the_bandwidth():
    # 2 GFLOP of linears at 8 GFLOP/s and 5 GB of cache at 10 GB/s: 1/4 + 1/2 of a second,
    # sums that binary floating point holds exactly
    work = Work(tokens=10, linear_flops=2e9, attention_flops=1e9, attention_bytes=5e9)
    limits = Limits(matmul_peak=100.0, linear_peak=8.0, bandwidth=10.0)
    assert limits.floor_seconds(work) == 0.25 + 0.5
