"""A reply written into the client's own pool, where a client on the same host watches for it.

Through ZeroMQ a reply wakes three sleeping threads on its way: the
worker's I/O thread, the client's, and then the client's own thread. On a
VM each wake of an idle vCPU goes through the host (a 3 ms call's hops: 0.76
ms through ZeroMQ, 0.56 ms with the reply read from shared memory). So a request may name a block
of its memfd pool (``reply_slot``: segment, offset, nbytes, token); the
worker writes the signed reply's frames there before it sends them through
ZeroMQ as always, and a client that spins on the block's first word has the
reply without any thread being woken. The ZeroMQ copy still counts whenever
the one in memory cannot be used (the client stopped spinning, the reply did
not fit, a read that does not verify); the client drops it unread otherwise.

Layout, int64 words then bytes: ``[state, n, len_0 .. len_n-1, frame_0 ...]``.
``state`` is written last: the request's ``token`` once the frames are
complete, ``-token`` when they do not fit (stop spinning: ZeroMQ has them).
The frames are the signed message itself, checked as any reply is: a read
that raced the writes (stores seen out of order) fails the signature and the
ZeroMQ copy is used.

The same layout carries requests the other way (``next_slot``): a request
names a block of the pool that its thread keeps, and a token; after the
reply, the worker's thread watches that block for up to the worker's
``watch_ms`` (3 ms by default) while it has nothing else to do, and the
client writes its next request there (``token`` last). A fit+predict pair's
second call then reaches a worker thread that is awake, without a ZeroMQ I/O
thread or a sleeping reader between them. The worker reads the message as it
reads any (signature, time, replay, and the client must be the block's
owner). After the watch the block stays armed: the client rings the worker's
doorbell (a Unix datagram socket beside the worker's own) when it writes
there, with a datagram that names the block (:func:`ring_of`), and the
worker's reader, which polls the doorbell beside its socket, reads that block
then (``Worker._answer_bell``). An estimator's call whose slot no thread watches also rings as it starts,
before it checks X, unless X is copied on all cores (``Connection.heads_up``): a ring for an armed slot that
holds nothing yet has the reader watch it (once per reply, while the worker has nothing else to do), so the
request finds a thread awake. The client sends the request through ZeroMQ
as well only where the worker does not take it from the block (below);
where both copies go, whichever comes second is dropped as a duplicate.

The worker says where it stands in two more words, so that neither side
does more than it must:

- the **watch word**, the last word of a request slot: the token a worker
  thread watches the slot for, set when it starts and cleared (0) when it
  stops. The client rings only where it does not read its request's token
  there: a ring to a thread that watches only wakes the worker's reader.
- the **state word** of a request slot, once the worker has read the request
  there: ``taken(token)`` once it is queued to run, ``-token`` where it was
  not (refused, a duplicate, the client's queue full, a quick operation).
  The client holds the request's ZeroMQ copy back until then and sends it
  only where the request was not taken, or no mark came within
  ``COPY_AFTER``: a copy that arrives while the request runs
  would only be read and dropped, by a reader that holds the worker's GIL
  meanwhile. Both words are hints for speed: a mark missed or out of date
  costs the wait for the ZeroMQ copy, never a request. Since the worker
  writes into a request slot, a client never gives one back to its pool for
  arrays while the connection lives: the slot of a thread that is gone
  serves another thread's requests.
"""

import os
import struct

WORD = 8
MAX_FRAMES = 1024  # a reply's frames: the signature, the header, and its arrays' frames
TOKEN_LIMIT = 1 << 62  # tokens lie in [1, TOKEN_LIMIT): they and their negatives fit an int64
REQUEST_SLOT_MAX = 1 << 20  # bytes: a longer request slot is not watched (a block of the pool is 1 MiB)


RING_MAX = 256  # bytes of a ring the worker reads: one that :func:`ring_of` makes is far shorter
TAKEN = TOKEN_LIMIT  # added to a request's token once the worker has queued it: never a token, nor minus one
COPY_AFTER = 0.002  # seconds a request written into its slot waits for the worker's mark before its ZeroMQ copy


def ring_of(client, slot):
    """The datagram that rings for the request slot ``slot`` (a ``next_slot``: segment, offset) of ``client``."""
    return f"{client}:{slot.get('segment')}:{slot.get('offset')}".encode()[:RING_MAX]


def new_token():
    """A request's token: positive, so that ``-token`` (did not fit) differs from every token and from 0.

    62 random bits of ``os.urandom`` (``secrets``' own source; its ``randbelow`` took 2-3 µs a call)."""
    return (int.from_bytes(os.urandom(8), "little") >> 2) or 1


def is_token(value):
    """Whether a request's ``token`` is one :func:`new_token` could have made (bools and floats are not)."""
    return type(value) is int and 0 < value < TOKEN_LIMIT


def state_word(memory):
    """The first word of a slot, as a one-element int64 view that reads the shared memory itself (a memoryview:
    read or written as a Python int, in a third of the time a numpy view takes on cold caches)."""
    return memory[:WORD].cast("q")


def taken(token):
    """What the worker writes into a request slot's state word once it has queued the request read there."""
    return token + TAKEN


def watch_word(memory):
    """The last word of a request slot (as :func:`state_word`): the token a worker thread watches it for; anything
    else: ring."""
    return memory[len(memory) - WORD :].cast("q")


def request_room(memory):
    """Where a request slot's request goes: all of it but its watch word."""
    return memory[: len(memory) - WORD]


def write(memory, token, frames):
    """Write ``frames`` into ``memory`` and then ``token``; True if they fit (else ``-token`` only).

    The words go through ``struct``, not numpy: numpy's views of two or three words cost two to three times
    as much (a request written and read back: 4-8 us this way, 11-18 us with views)."""
    views = [memoryview(frame).cast("B") for frame in frames]
    sizes = [view.nbytes for view in views]
    start = WORD * (2 + len(views))
    if len(memory) < WORD:
        return False
    if start + sum(sizes) > len(memory):
        state_word(memory)[0] = -token
        return False
    struct.pack_into(f"{1 + len(views)}q", memory, WORD, len(views), *sizes)
    position = start
    for view in views:
        memory[position : position + view.nbytes] = view
        position += view.nbytes
    state_word(memory)[0] = token
    return True


def read(memory):
    """The frames a complete slot holds, copied out (the block is reused): None if its lengths do not add up."""
    if len(memory) < 2 * WORD:
        return None
    (count,) = struct.unpack_from("q", memory, WORD)
    start = WORD * (2 + count)
    if not 2 <= count <= MAX_FRAMES or start > len(memory):
        return None
    sizes = struct.unpack_from(f"{count}q", memory, 2 * WORD)
    if min(sizes) < 0 or start + sum(sizes) > len(memory):  # Python ints: no sum wraps around
        return None
    frames, position = [], start
    for index, size in enumerate(sizes):
        piece = memory[position : position + size]
        frames.append(bytes(piece) if index < 2 else bytearray(piece))  # arrays' frames: writable, as ZeroMQ's
        position += size
    return frames
