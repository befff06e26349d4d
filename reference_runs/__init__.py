"""Instrumented reference trainers and the pieces they share.

One file per parallelism (DP, TP, PP, EP MoE, ZeRO-3) built on a shared tiny GPT (`model`), a
validated rank grid (`topology`), synthetic data (`data`), fault injection (`faults`), the
command-line options common to every trainer (`config`) and the skeleton every trainer runs in
(`common`: set-up, recorder, data, steps, shutdown). The pipeline schedules, the injection specs and
the shared names are diag's (diag/contract/schedules.py, diag/contract/injections.py,
diag/contract/names.py), which the simulator uses too.
"""
