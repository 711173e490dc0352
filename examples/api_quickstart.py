"""The Python API in a few lines: assisted vs plain greedy decoding on two tiny random Llamas.

    python examples/api_quickstart.py

Random weights make a poor draft, so the draft here is a slightly perturbed copy of the target:
the point is the API, that both runs give the same tokens, and what the statistics say.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import assisted_backends

assisted_backends.set_threads()  # the cores this process may use (affinity, cgroup quota, ranks); or (n)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=512,
)
target = LlamaForCausalLM(config).eval()
draft = LlamaForCausalLM(config).eval()
draft.load_state_dict(target.state_dict())
with torch.no_grad():
    for weight in draft.parameters():
        weight.add_(0.05 * weight.std().nan_to_num(0.0) * torch.randn_like(weight))

prompt = torch.randint(0, 256, (1, 32))
plain = assisted_backends.generate(target, prompt, max_new_tokens=48)
assisted = assisted_backends.generate(target, prompt, assistant_model=draft, max_new_tokens=48, num_assistant_tokens=4)

assert torch.equal(plain.sequences, assisted.sequences), "greedy assisted output must equal plain output"
stats = assisted.stats
print(f"identical tokens: True; new tokens {stats.new_tokens}")
print(
    f"{stats.speculative_rounds} speculative rounds: acceptance rate {stats.acceptance_rate:.2f} (accepted / drafted), "
    f"{stats.tokens_per_speculative_round:.2f} tokens per round (the target's own included); "
    f"{stats.plain_rounds} plain rounds"
)
print(f"target forwards: plain {plain.stats.target_forwards}, assisted {stats.target_forwards}")
