"""Carrying out a plan: the plan itself, the container engine, the executor, its log and report.

Uses ``config``'s entries and ``outputs``' build contexts; neither of them imports from here.
"""
