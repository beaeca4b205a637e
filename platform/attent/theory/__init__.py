"""The theory lab: the paper's single attention layer, its closed-form gradients, its empirical
attention neural tangent kernel (ANTK), and the teaching experiment of Algorithm 1.

    learner.py    f_θ(S) = softmax(Q Kᵀ/√d) V, with the masked and cross-attention variants
    gradients.py  ∂f/∂W^V, ∂f/∂W^Q_(:,i), ∂f/∂W^K_(:,i) with the importance scalars ω, vs autograd
    teaching.py   the teaching rules compared: greedy (Algorithm 1) vs random vs full teaching of
                  a random target attention layer
    tangent_kernel.py  the empirical ANTK of any model and its drift (torch.func), which the engine's
                  ``antk`` tracking uses during training too
    config.py     the experiment's settings

Pure maths (torch): nothing here imports the engine or MLflow. The lab that runs it into MLflow, its
summary and figures, is ``attent.lab``: ``python -m attent.lab experiments/theory_teaching.yaml
[key.path=value ...]`` (or `attent theory FILE`).
"""
