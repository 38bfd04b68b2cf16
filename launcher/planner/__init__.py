"""The planner: from a model, a cluster and a memory budget to the fastest plan that fits.

  space.py     the candidates (ZeRO stage, offloads, TP, PP, micro-batch, accumulation, recompute)
  search.py    every candidate's memory verdict; feasible plans ranked by estimated speed
  perf.py      the performance model (step time, tokens/s, MFU, a breakdown per step)
  explain.py   why a family does not fit, why the chosen plan won
  advise.py    when nothing fits: the smallest computed change that would
  select.py    with no cluster given: the smallest fitting count of each GPU type, and its cost
  shapes.py    the cluster sizes advice and selection try (1, 2, 4 ... GPUs, then whole nodes)
  ablate.py    what each technique buys in memory and costs in speed, added one by one
  plans.py     Request, Plan, PlanResult and friends
  constants.py every assumption, documented

Planning imports no torch, deepspeed or transformers.
"""
