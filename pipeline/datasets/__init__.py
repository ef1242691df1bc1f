"""Judged data sets: the generated demo corpus, LoCoMo and BEIR loaders.
"""
