"""The ray executor on a real Ray cluster (conftest.py, on loopback): what the conformance suite
(tests/test_conformance.py) leaves out, functions sent to the actors and sleep."""

from __future__ import annotations

from llmp import LLM, SamplingParams
from llmp.testing import save_tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 42 + 3 * i, 99, 7 * i + 3]} for i in range(2)]


def greedy_tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_functions_run_on_every_actor_and_the_weights_come_back_after_sleep(cluster, tmp_path):
    save_tiny_llama(tmp_path, num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    llm = LLM(
        str(tmp_path), dtype="float32", max_model_len=128, executor="ray", tensor_parallel_size=2, ray_address=cluster
    )
    try:
        before = greedy_tokens(llm)
        # a lambda: Ray pickles it by value for the actors, in rank order
        assert llm.collective_rpc(lambda worker, x: worker.rank * x, args=(10,)) == [0, 10]
        llm.sleep(2)  # the weights discarded on both actors, loaded again on wake
        llm.wake_up()
        assert greedy_tokens(llm) == before
    finally:
        llm.shutdown()
