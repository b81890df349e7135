"""Serving: what an inference configuration costs (``inference``) and what is served
(``inference_job``), read off the same ``LayerCosts`` and hardware as training.
"""
