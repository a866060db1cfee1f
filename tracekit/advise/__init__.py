"""``tracekit advise``: allocator settings that let a recorded run fit, verified by replay.

``candidates`` lists what can be changed for a trace's allocator (PyTorch's caching
allocator settings, CuPy's pool and its alternatives, free-list policies for raw
traces); ``search`` replays them side by side on threads under the limit and bisects
the smallest capacity where nothing fits (``capacity``: the bisection, also ``tracekit whatif``'s
search per policy); ``counterfactual`` prepares a recording for
replay under a setting it was not run with, and ``fidelity`` measures such predictions
against real runs.
"""
