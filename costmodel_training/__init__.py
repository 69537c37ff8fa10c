"""Entry points of the DVC stages (dvc.yaml): collect (the dataset); featurize and pretrain
come with the cost-model pretraining (issue 4, part 3)."""
