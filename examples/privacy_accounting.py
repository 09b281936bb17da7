"""Privacy accounting from Python: the answers of ``fedsim account``, as dicts.

Run:  python examples/privacy_accounting.py
"""

import fedsim

# eps of 1000 Poisson-sampled DP-SGD steps at q = 0.01, sigma = 1.1 (add/remove neighbours)
answer = fedsim.account(q=0.01, sigma=1.1, steps=1000, delta=1e-5)
print(f"eps = {answer['epsilon']:.4f} at delta = {answer['delta']:g} ({answer['accountant']}), "
      f"GDP mu fit {answer['mu']:.3f}")

# the smallest sigma for eps = 3 over 20 epochs of a 60000-record data set at batch 256
sigma = fedsim.account(batch_size=256, dataset_size=60000, epochs=20, target_epsilon=3.0)
print(f"sigma for eps 3 over 20 epochs: {sigma['sigma']:.4f} ({sigma['steps']} steps)")

# fixed-size batches are replace-one neighbours: different numbers, never compared directly
fixed = fedsim.account(sampling="fixed", q=0.01, sigma=1.1, steps=1000)
print(f"fixed-size batches: eps = {fixed['epsilon']:.4f} ({fixed['neighbouring_relation']})")

# the largest number of steps that stays within eps = 2 at sigma 1.0
steps = fedsim.account(q=0.01, sigma=1.0, target_epsilon=2.0, max_steps=True)
print(f"steps within eps 2 at sigma 1.0: {steps['steps']}")
