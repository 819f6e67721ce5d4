"""Dataset geometry for the dataset card and the report: intrinsic dimension (MLE/LID, TwoNN) and relative
contrast; the estimates (scikit-dimension) and the stage that records them.
"""
