"""Instrumented reference trainers and the pieces they share.

One file per parallelism (DP, TP, PP, EP MoE, ZeRO-3) built on a shared tiny GPT (`model`), a
validated rank grid (`topology`), synthetic data (`data`), fault injection (`faults`) and the
command-line options common to every trainer (`config`).
"""
