"""gradtune's cost model (Felix/TenSet MLP over the symbolic features): the model, its
training and ranking metrics, featurization of tuning records, pretraining on a dataset, and
the online copy a tuning session fine-tunes."""
