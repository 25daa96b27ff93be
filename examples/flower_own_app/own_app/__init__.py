"""A Flower app of your own that trains with fednorm's methods (FedBN, SiloBN, HBN, FBN)."""
