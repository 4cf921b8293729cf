import pytest
import torch

from zoo.quant.nanoquant import pack_signs, packed_width, unpack_signs


@pytest.mark.parametrize("shape", [(1,), (5, 1), (3, 7), (4, 9), (2, 3, 13), (6, 17), (2, 64)])
def test_round_trip_exact_any_shape_odd_widths(shape):
    g = torch.Generator().manual_seed(sum(shape))
    s = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    p = pack_signs(s)
    assert p.dtype == torch.uint8
    assert p.shape == (*shape[:-1], packed_width(shape[-1]))
    assert packed_width(shape[-1]) == -(-shape[-1] // 8)
    assert torch.equal(unpack_signs(p, shape[-1]), s)


def test_bit_order_lsb_first_and_zero_is_plus_one():
    s = torch.tensor([[1.0, -1, 1, 1, -1, -1, -1, 1, 0.0]])
    p = pack_signs(s)
    assert p.tolist() == [[1 + 4 + 8 + 128, 1]]
    assert unpack_signs(p, 9).tolist() == [[1.0, -1, 1, 1, -1, -1, -1, 1, 1]]


def test_padding_bits_are_written_zero_and_ignored():
    s = -torch.ones(3, 11)
    p = pack_signs(s)
    assert int(p[:, -1].max()) == 0  # padding written as zero
    dirty = p.clone()
    dirty[:, -1] |= 0b11111000  # set the 5 padding bits of the last byte
    assert torch.equal(unpack_signs(dirty, 11), s)


def test_unpack_rejects_wrong_width():
    with pytest.raises(ValueError, match="packed width"):
        unpack_signs(torch.zeros(2, 3, dtype=torch.uint8), 9)
