"""Upper bounds on scenario input, each with the reason it is where it is.

A scenario file is untrusted input: someone else's file, a typo, a generated sweep. Every number
that sizes an allocation or a loop is bounded here, so that a bad value is an error naming its
YAML path instead of an out-of-memory kill, an overflow deep inside a run, or a run that never
ends. The bounds are far above any scenario that makes sense on one machine; each says why.
"""

from __future__ import annotations

MAX_SCENARIO_BYTES = 2**20
"""1 MiB. The shipped scenarios are a few KiB; a scenario with a thousand groups is a few hundred
KiB. The cap is checked before anything is parsed; YAML scans at about 2 MB per second in pure
Python, so reading a file at the cap costs well under a second."""

MAX_YAML_DEPTH = 64
"""Nesting levels of mappings and lists. The schema itself is 6 levels deep; the cap is far below
the depth at which the YAML composer would exhaust Python's recursion limit (about 300)."""

MAX_YAML_VALUES = 50_000
"""Values (mappings, lists and scalars) in the file once every alias is expanded: each costs
about 30 microseconds and a kilobyte while it is composed and validated, so the cap bounds that
to about 1.5 s and 50 MB (a thousand groups of 30 settings each fit). Composition stops at the
cap, and anchors and aliases, which let a small file stand for an exponentially large tree (the
"billion laughs" attack), are counted expanded."""

MAX_CLIENTS = 1_000_000
"""Clients in a scenario (all groups together) and in a group. One process holds every
client's actor, ledger and record indices (the ledgers share one directory lock from a few
thousand clients on, not a descriptor each): a message-only client holds about 12 KB
(docs/SCALE.md, a million about 13 GB); a training client also holds its own local model,
whose size the model sets. The bound catches a count off by orders of magnitude."""

MAX_INVITED_CLIENTS = 131_072
"""Clients a window's invitation names (``server.participation < 1``): the global model's
header carries the invitation as a bitmap of one bit a client, at most 32 KiB of hex."""

MAX_UNACKNOWLEDGED = 256
"""Updates a deployed client keeps unacknowledged (its outbox; the oldest is abandoned past
it). The server sizes what it keeps per client from it: the farthest round ahead it accepts
(``integrity.MAX_ROUND_GAP``) and its table of received, unrecorded rounds
(``mqtt_server.MAX_UNRECORDED_PER_CLIENT``), four times this each, so honest resends never meet
either bound."""

MAX_ROUNDS = 1_000_000
"""A group's ``rounds``: its clip and noise schedules and its privacy plan hold one entry per
round in memory."""

MAX_LOCAL_STEPS = 10_000
"""DP-SGD steps per round: a round computes them all before it releases anything (100 local
epochs at q = 0.01)."""

MAX_WINDOWS = 10_000_000
"""Server windows (also the ceiling of ``eval_every`` and ``broadcast_every``)."""

MAX_SECONDS = 1e9
"""Any time in virtual seconds (about 31 years). Event times are float64 sums, which stay exact
to a microsecond below 10^9 s."""

MIN_WINDOW = 1e-3
"""The shortest server window, in virtual seconds: every window is an event of the run, and a run
of ``stop.virtual_seconds`` must not need more than MAX_WINDOWS of them."""

MAX_LOGNORMAL_SIGMA = 20.0
"""The spread of a log-normal distribution: exp(sigma z) must stay finite for every standard
normal draw z a run can see (|z| < 9 in 10^18 draws; exp overflows above 709)."""

MAX_SCALE = 1e6
"""Clip norms, noise multipliers, learning rates, weights and distances. The released noise has
standard deviation sigma C (2 sigma C for fixed-size batches), which must stay far inside float32
(3.4e38) after summing over a model's parameters."""

MAX_EPSILON = 100.0
"""Privacy budgets and calibration targets. Beyond eps = 100 the guarantee says nothing
(e^100 > 10^43) and accountants' e^eps terms approach double-precision overflow (eps = 709)."""

MIN_DELTA = 1e-12
"""The smallest delta of a budget, a target or the report. The privacy-loss-distribution
accountant charges the probability mass it leaves out of its grid (up to about 1e-13 over a long
run) to delta, so below about 1e-13 its epsilon is inflated or infinite; 1e-12 keeps a factor of
ten clear of that, and is far below any delta a data set of fewer than 10^6 records needs. Where
a delta below it is asked (a ledger or a question through the Python API), the PLD answers
nothing there and the other guarantees do (:func:`fedsim.privacy.accountant.smallest_epsilon`):
its eps at delta 1e-14 was not even monotone in the steps."""

MAX_SAMPLES = 10_000_000
"""Records of a generated (synthetic) training or test set, and the evaluation subset."""

MAX_FEATURES = 100_000
"""Features of a generated data set."""

MAX_SYNTHETIC_VALUES = 50_000_000
"""num_samples x num_features of a generated training set: 400 MB as float64 while it is drawn,
200 MB as the float32 tensor that is kept."""

MAX_CLASSES = 10_000
"""Classes of a generated data set (each needs its own mean vector and test records)."""

MAX_BATCH = 1_000_000
"""batch_size and max_physical_batch; a batch is also bounded by the client's records."""

MAX_SHARDS_PER_CLIENT = 100_000
"""Shards per client of the ``shards`` partition."""

MAX_MESSAGE_BYTES = 2**30
"""1 GiB: ``network.max_message_bytes``, the largest message a broker or the simulated network
carries; a model whose parameters do not fit in it can never be broadcast."""

MAX_ROUNDS_PER_WINDOW = 1_000_000
"""Expected rounds a client and server window (the window over a round's mean virtual time)
that nothing bounds or paces: more, and virtual time all but stands still (a speed of 0, the
default, is infinitely many); a real client's round takes at least milliseconds."""

MAX_RUN_FILE_BYTES = 2**29
"""512 MiB: the largest ``metrics.jsonl``, ``summary.json``, ``server.json`` or ``clients.csv``
a report reads (a run of a week with one-second windows writes about 200 MB of metrics; 10^6
clients' rows, about 300 MB). A larger file handed over is refused, not read into memory."""

MAX_LEDGER_BYTES = 2**29
"""512 MiB: the largest privacy ledger file (or copy of one) fedsim reads - ``fedsim ledger
check`` and ``repair``, ``account --ledger``, a report, a client or a resume opening its
ledger. A ledger holds a record a round and a few before round one: at most ``MAX_ROUNDS``
(10^6) round records of about 190 bytes each (a repair's substitute, about 300), so about
200-300 MB at the very most, well under the cap; a tuning ledger's selections are a handful of
lines of at most 1 MiB. A larger file (a sparse file of 1 GiB takes 4 KB on disk: an
attacker's review had ``ledger check`` use 1.4 GB and a report fail with MemoryError) is
refused from its size before anything is read."""

MAX_TORCH_THREADS = 1024
"""torch threads for training."""

MAX_SEED = 2**63 - 1
"""Seeds are 64-bit integers in run files and for the random-number generators."""

MAX_MODEL_LAYERS = 1000
"""Items of a list option of a model (``hidden``: one layer each): every layer is a module object
and a step of every forward and backward pass."""

MAX_MODEL_PARAMETERS = 100_000_000
"""Trainable parameters of a model (400 MB per float32 copy). DP-SGD holds per-example gradients
of a whole physical batch at once (batch x parameters values), and the simulation keeps several
copies (global, local, updates in flight); the model must also fit in one network message
(4 bytes per parameter within ``network.max_message_bytes``)."""

MAX_DATASET_RECORDS = 10_000_000
"""Records of one split of a torch ``Dataset`` from a data set factory or from Python: each is
read item by item (one Python call each, about a microsecond at best) when it is converted to
tensors once, so 10^7 records cost seconds, not hours."""

MAX_DATASET_VALUES = 1_000_000_000
"""Values (records x values per record) of one split of a torch ``Dataset`` converted to
tensors: 4 GB as float32, allocated at once before the items are copied in (CIFAR-10's training
set holds 1.5 x 10^8). Checked from the first item's shape before anything is allocated."""

MAX_AGGREGATORS = 64
"""The most aggregation nodes a scenario may place between its clients and its server."""
