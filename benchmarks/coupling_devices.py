"""GPU checks of the block Jacobians: a bf16 model and a model split over two devices (``device_map``).

1. bf16: the same random GPT-2-shaped model in float32 and in bf16 on the GPU; the bf16 blocks are copied to
   float32 for the Jacobian, so the Jacobians differ only by the bf16 rounding of weights and block inputs.
2. device_map: the model loaded with ``device_map="auto"`` (accelerate's hooks on every block) gives the same
   Jacobians as the model moved with ``.cuda()``; blocks offloaded to the CPU (meta weights loaded at each call)
   are refused with a clear error.

    python benchmarks/coupling_devices.py            # needs a GPU and accelerate
"""

import tempfile

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from layerwise.features.jacobian import diagonal_jacobians, trace_blocks
from layerwise.metrics.functional_dynamics import coupling_score, depth_coupling

hf_logging.set_verbosity_error()


def jacobians(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    blocks = model.transformer.h
    trace = trace_blocks(blocks, lambda: model(input_ids=ids, use_cache=False))
    return diagonal_jacobians(blocks, trace, -1).float().cpu()


def main() -> None:
    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", n_layer=6, n_embd=256, n_head=4, vocab_size=1000, n_positions=128)
    reference = AutoModelForCausalLM.from_config(config).eval()
    state = reference.state_dict()
    ids = torch.randint(0, 1000, (1, 48), generator=torch.Generator().manual_seed(1))
    exact = jacobians(reference.cuda(), ids.cuda())
    print(f"float32 on {torch.cuda.get_device_name()}: J {tuple(exact.shape)}, max |J| {exact.abs().max():.3f}")

    half = AutoModelForCausalLM.from_config(config).eval()
    half.load_state_dict(state)
    half = half.to(device="cuda", dtype=torch.bfloat16)
    bf16 = jacobians(half, ids.cuda())
    relative = ((bf16 - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2))).max().item()
    scores = coupling_score(depth_coupling(exact, (10, 30))), coupling_score(depth_coupling(bf16, (10, 30)))
    print(
        f"bf16 model, float32 Jacobians: dtype {bf16.dtype}; largest relative Frobenius difference per block "
        f"{relative:.2e}; coupling score K=10,30 float32 {scores[0].tolist()} vs bf16 {scores[1].tolist()}"
    )

    with tempfile.TemporaryDirectory() as folder:
        reference.cpu().save_pretrained(folder)
        placed = AutoModelForCausalLM.from_pretrained(folder, device_map="auto").eval()
        hooked = sum(hasattr(module, "_hf_hook") for module in placed.modules())
        dispatched = jacobians(placed, ids.cuda())
        print(
            f"device_map='auto' ({hooked} modules with accelerate hooks): max |J - J(.cuda())| "
            f"{(dispatched - exact).abs().max():.2e}"
        )
        offloaded = AutoModelForCausalLM.from_pretrained(
            folder,
            device_map={
                "transformer.wte": 0,
                "transformer.wpe": 0,
                "transformer.h": "cpu",
                "transformer.ln_f": 0,
                "lm_head": 0,
            },
        ).eval()
        try:
            jacobians(offloaded, ids.cuda())
            print("offloaded blocks: Jacobians computed")
        except ValueError as error:
            print(f"offloaded blocks: refused: {error}")


if __name__ == "__main__":
    main()
