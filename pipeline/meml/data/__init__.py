"""What training starts from: the real data sets' loaders, the toy world, the experts' prompts and
trajectories (from gold rationales, teachers or a bring-your-own file) and the tiny models.
Imports only meml.core."""
