"""Priorities of the simulator's events at the same time, lowest first (docs/DESIGN.md section 4):
transfer landings, then replica operation ends, then cluster events (scale-out, failures,
drains), then arrivals, then an idle replica's scheduler wake-up, then a lagged view's snapshot.
One definition for the engine and for the schedulers that push operation ends themselves."""

TRANSFER, OP, CLUSTER, ARRIVAL, KICK, SNAP = 0, 1, 1.5, 2, 3, 4
