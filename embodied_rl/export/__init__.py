"""``embodied-rl export``: a run's policy in the Hugging Face layout, with a model card.

Reads a run folder written by ``embodied-rl train`` (its ``config.yaml`` and one sealed
checkpoint, the newest by default) and writes::

    <out>/README.md    the model card: how to load it, the training command, data, config,
                       evaluation results (model_card.py)
    <out>/...          the actor, as its policy writes itself (registry.EXPORTERS, e.g.
                       config.json, model.safetensors, dataset_statistics.json, tokenizer)
    <out>/critic/...   the critic, with ``critic=True``

The modules: ``run.py`` (:func:`~embodied_rl.export.run.export_run`: build the models on the
CPU, load the checkpoint, write the folder and move it into place), ``result.py`` (what an
export wrote) and ``model_card.py`` (the README.md). The result types have a module of their
own so that the card, which describes a result, and the export, which writes the card, do
not import each other.
"""
