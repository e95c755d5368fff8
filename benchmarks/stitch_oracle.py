"""The stitching recipe on the rotated-copy oracle of ``tests/lightning_modules/test_stitching.py``: held-out penalty
vs B over the steps.

B is A with its residual stream rotated, so phi(h) = Q h stitches exactly and every penalty above 0 is the recipe's.
The text is sampled from A in 32-token blocks (``--sequences`` of them; 640 is the test's, 10x that tests whether the
rest is overfitting). The loop is ``Stitched``'s own (its loss, optimiser and schedule, clip 1.0), written out so the
penalty can be printed every quarter of the steps:

    python benchmarks/stitch_oracle.py --layer 2 --phi_init zero                        # the default recipe
    python benchmarks/stitch_oracle.py --layer 2 --phi_init least_squares --lr 0.001 --sequences 6400

Measured 2026-11-25 at l = 2, seed 0, on the shared 2-core VM (load 10-18): 640 sequences, lr 0.1: 0.022 from either
start; least squares with lr 0.01: 0.016, lr 0.001: 0.010 (growing with the steps: overfitting), lr 0.001 with
weight decay 0.1: 0.0049; 6,400 sequences, lr 0.1: 0.012 (zero) and 0.019 (least squares); least squares with
lr 0.001: -0.0012. On 2026-11-26 (load ~2), the least-squares start: after 100 steps 0.22 (lr 0.1) and 0.011
(lr 0.01), and 0.4-0.5 at lr 0.1 through steps 200-600. So SGD does not improve on the exact start here, and
``layerwise stitch`` keeps the start through its dev slice (``--dev_blocks``; this loop has none).
"""

import argparse
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "lightning_modules"), str(TESTS)]  # test_stitching, and the shared modules it imports
from test_stitching import DIM, PRINTABLE, folded_llama, rotated  # noqa: E402

from layerwise.commands._options import TextSource  # noqa: E402
from layerwise.lightning_modules.stitched import Stitched  # noqa: E402


def oracle(sequences: int) -> tuple[torch.nn.Module, torch.nn.Module, Path]:
    """A, its rotated copy B (float32) and a text file of ``sequences`` 32-byte blocks sampled from A."""
    a = folded_llama(layers=3, vocab=257)
    with torch.no_grad():
        printable = torch.zeros(257, dtype=torch.bool)
        printable[list(PRINTABLE)] = True
        a.lm_head.weight[~printable] = 0.0
        a.lm_head.weight[printable] *= 3.0
    q, _ = torch.linalg.qr(torch.randn(DIM, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    b = rotated(a, q)
    torch.manual_seed(2)
    outside = [token for token in range(257) if token not in PRINTABLE]
    ids = a.generate(
        torch.randint(32, 127, (sequences, 1)),
        do_sample=True,
        max_new_tokens=31,
        min_new_tokens=31,
        pad_token_id=32,
        top_k=0,
        suppress_tokens=outside,
    )
    text = Path(tempfile.mkdtemp()) / "text.txt"
    text.write_text("".join(bytes(row.tolist()).decode("ascii") for row in ids))
    return a.float(), b.float(), text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phi_init", default="zero", choices=["zero", "least_squares"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--weight_decay", type=float, default=1e-3)
    parser.add_argument("--sequences", type=int, default=640)
    parser.add_argument("--reports", type=int, default=4, help="penalty printed this many times over the steps")
    args = parser.parse_args()
    a, b, text = oracle(args.sequences)
    data = TextSource([text], None, None).datamodule("byte", None, 32, 8, None, 64, "fit")
    pl.seed_everything(args.seed, verbose=False)
    m = Stitched(a, b, args.layer, args.layer, phi_init=args.phi_init, lr=args.lr, weight_decay=args.weight_decay)
    m.max_steps, m.warmup_steps = args.steps, args.steps // 10
    train, val = data.train_dataloader(), list(data.val_dataloader())
    configured = m.configure_optimizers()
    optimizer, schedule = configured["optimizer"], configured["lr_scheduler"]["scheduler"]

    def penalty() -> float:
        total = count = 0.0
        with torch.no_grad():
            for batch in val:
                stitched, n, _ = m.loss(m(batch), batch)
                own, _, _ = m.loss(m.model_b(**m._inputs(batch)).logits, batch)
                total, count = total + float(stitched - own) * int(n), count + int(n)
        return total / count

    if args.phi_init == "least_squares":
        pairs = [(m.residual_a(batch).flatten(0, 1), m.residual_b(batch).flatten(0, 1)) for batch in list(train)[:4]]
        m.phi.fit_least_squares(torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs]))
    print(f"step 0: penalty vs B {penalty():+.5f} nats", flush=True)
    step = 0
    while step < args.steps:
        for batch in train:
            loss, _, _ = m.loss(m(batch), batch)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.phi.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step % max(1, args.steps // args.reports) == 0:
                print(f"step {step}: penalty vs B {penalty():+.5f} nats", flush=True)
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
