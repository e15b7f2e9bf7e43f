"""fastText subwords of a stored table: the n-gram hashing and composition (``hashing``), the
``ngrams`` array beside ``vectors`` (``ngrams``) and the import of a fastText ``.bin`` into a
table (``build``)."""
