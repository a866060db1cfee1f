"""Simulated allocators: the policy contract (``base``), the policies, the replay engine."""
