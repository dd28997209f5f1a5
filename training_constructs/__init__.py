"""Reusable L3 constructs of spotrun, one per module. (Not named `constructs`: that would shadow the library.)"""
