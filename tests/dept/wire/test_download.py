"""The download codec's arithmetic: the server and a node make the same body, bit for bit,
and what one round's codes miss goes down in the next."""

from __future__ import annotations

import pytest
import torch

from dept.wire.download import KINDS, apply_change, body_digest, encode_change


def _body(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(64, 48, generator=gen),
        "b.bias": torch.randn(300, generator=gen),
    }


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "none"])
def test_a_node_makes_the_servers_body_bit_for_bit(kind: str) -> None:
    held, theta = _body(0), _body(1)
    codes, server = encode_change(theta, held, kind)
    node = apply_change({n: v.clone() for n, v in held.items()}, codes, kind)

    assert body_digest(node) == body_digest(server)
    assert all(torch.equal(node[n], server[n]) for n in server)


def test_what_a_round_misses_goes_down_in_the_next() -> None:
    held, theta = _body(0), _body(1)
    errors = []
    for _ in range(4):  # θ stands still: each round's change is the last one's error
        _, held = encode_change(theta, held, "int2")
        errors.append(max(float((theta[n] - held[n]).abs().max()) for n in theta))
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0] / 4


def test_the_digest_tells_bodies_apart_by_one_value_or_one_name() -> None:
    body = _body(0)
    flipped = {**body, "b.bias": body["b.bias"].clone()}
    flipped["b.bias"][7] = torch.nextafter(flipped["b.bias"][7], torch.tensor(1e9))
    renamed = {"c.bias" if n == "b.bias" else n: v for n, v in body.items()}

    digests = {body_digest(b) for b in (body, flipped, renamed)}
    assert len(digests) == 3
    assert body_digest(body) == body_digest({n: v.clone() for n, v in reversed(body.items())})
