"""The contracts every room shares, at the bottom of the import layers: the answer format that
rewards, graders, curation and evaluation read, and the reward names that configs may use."""
