"""Arrays of a request in the shared-memory pool: the blocks it holds, and the block its reply fills."""

import weakref

import numpy as np

from ..errors import ProtocolError


def placer(pool, blocks):
    """A ``place(nbytes)`` for :class:`~sklearn_gpu_bridge.protocol.Encoder`: a block of ``pool`` per array,
    appended to ``blocks`` (the request holds them until its reply has been read)."""

    def place(nbytes):
        block = pool.allocate(nbytes)
        blocks.append(block)
        return block.segment, block.offset, block.buffer()

    return place


class OutputBlock:
    """Reads reply arrays from the request's output block; the block lives as long as they do."""

    def __init__(self, block):
        self.block = block
        if block is not None:
            self.whole = np.frombuffer(block.buffer(), np.uint8)
            weakref.finalize(self.whole, block.release)

    def __call__(self, segment, offset, nbytes):
        block = self.block
        if block is None:
            raise ProtocolError("reply names the pool, but no output block was given")
        start = offset - block.offset if type(offset) is int else -1
        if segment != block.segment or start < 0 or start + nbytes > block.nbytes:
            raise ProtocolError("reply array lies outside the output block")
        return self.whole[start : start + nbytes].data
